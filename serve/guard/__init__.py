"""``CriticGuard``: the critic in the agent loop around any policy callable.

Per step: observe the new screen (the macro history comes back and is
handed to the policy), let the policy propose, critique the proposal, and on ``bad`` feed the
explanation back and re-propose, up to ``max_reproposals`` times; then execute. A critic that
abstains, fails or is unreachable never blocks: the proposal is executed as is.

Two loop-level rescues run on top:

* **R3** (Reset, Reroute, Restore) when the gateway's recurrence detector fires (the same
  screen–action pair repeated without effect): the policy proposes from a fresh context (task and
  current screen only), each proposal is executed and the first that changes the screen is kept;
  the policy's history afterwards is the history before the loop plus the kept step, and the
  gateway's macro history is rebuilt the same way (the session re-seeded with the echo from
  before the loop, the kept step observed again), so neither shows a trace of the loop.
* **ReTrace recovery** when the gateway proposes a recovery target (an earlier intact screen): a
  bounded sub-loop gives the policy the gateway's brief until the target screen is back.

The guard is a step-wise state machine, so it fits harnesses that execute actions themselves
(``step(screenshot) -> Decision``; the harness executes ``decision.proposal``) as well as those
where the guard sits inside the agent (``observe`` / ``review`` / ``commit``). ``run`` drives a
whole episode when the caller hands over an ``execute`` function.

Every step leaves one plain dict in ``guard.log`` (observe summary, proposals with verdicts,
outcome, R3/recovery events) for a harness log or a demo page.

Where each part lives: ``core`` (``CriticGuard``: observe -> review -> commit, best-of-N),
``reroute`` (R3) and ``recovery`` (ReTrace), each rescue a strategy object with its own state
behind the ``Rescue`` interface of ``state``; ``config`` (the settings) and ``decisions`` (what the
policy and the harness are handed).
"""

from serve.guard.config import (
    DEFAULT_FEEDBACK,
    GuardConfig,
    Mode,
    OnExhausted,
    R3Config,
    RecoveryLoopConfig,
)
from serve.guard.core import CriticGuard
from serve.guard.decisions import Decision, PolicyContext, Review, default_to_action, describe
from serve.guard.recovery import Recovery, frames_match
from serve.guard.reroute import ECHOES_KEPT, RESTORED_RESULTS_KEPT, Reroute
from serve.guard.state import GatewayNotes, Rescue, StepState

__all__ = [
    "DEFAULT_FEEDBACK",
    "ECHOES_KEPT",
    "RESTORED_RESULTS_KEPT",
    "CriticGuard",
    "Decision",
    "GatewayNotes",
    "GuardConfig",
    "Mode",
    "OnExhausted",
    "PolicyContext",
    "R3Config",
    "RecoveryLoopConfig",
    "Recovery",
    "Rescue",
    "Reroute",
    "Review",
    "StepState",
    "default_to_action",
    "describe",
    "frames_match",
]
