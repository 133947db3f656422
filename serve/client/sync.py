"""The synchronous client: ``CriticClient`` and its ``Session``, over ``httpx.Client``."""

from __future__ import annotations

import time
from typing import Any

import httpx

from serve.client.config import ClientConfig, client_config
from serve.client.flows import (
    Request,
    ReseedStatus,
    Run,
    SessionState,
    SessionView,
    diagnose_request,
    job_request,
    ready_request,
)
from serve.client.payloads import ActionInput, ImageInput, sendable, session_body
from serve.client.results import Job, Observation, Ranking, Verdict
from serve.client.transport import Attempt, Call, CircuitBreaker, Pause, Reply, Transport


class CriticClient:
    """Synchronous gateway client over one persistent ``httpx.Client``."""

    def __init__(
        self,
        base_url: str | None = None,
        config: ClientConfig | None = None,
        *,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        """A client of the gateway at ``base_url``.

        Args:
            base_url: Gateway root; overrides ``config.base_url`` when given.
            config: Limits and switches.
            token: Bearer token; overrides ``config.token`` when given.
            transport: An ``httpx`` transport (tests pass ``httpx.MockTransport``).
            breaker: A shared ``CircuitBreaker`` (one per client by default).
        """
        self._transport = Transport(client_config(base_url, config, token), breaker)
        self.config, self.breaker = self._transport.config, self._transport.breaker
        self._http = httpx.Client(transport=transport, **self._transport.http_options())

    # -- transport ----------------------------------------------------------------------

    def _send(self, call: Call) -> Reply:
        """Drive ``call_flow`` over ``httpx.Client``: the flow decides, this only does I/O."""
        run = Run(self._transport.flow(call))
        while not run.done:
            try:
                outcome = self._perform(run.step)
            except BaseException as exc:  # noqa: BLE001 - the flow records it, re-raises
                run.throw(exc)
            else:
                run.send(outcome)
        return run.value

    def _perform(self, step: Attempt | Pause) -> httpx.Response | None:
        if isinstance(step, Pause):
            time.sleep(step.seconds)
            return None
        args, kwargs = self._transport.request_args(step)
        return self._http.request(*args, **kwargs)

    def _drive(self, request: Request) -> Any:
        """Run a request to its result; any unexpected error gives its fallback (fail open)."""
        try:
            run = Run(request.flow)
            while not run.done:
                run.send(self._send(sendable(run.step)))
        except Exception:  # noqa: BLE001 - the agent loop must never see a client error
            return request.fail_open()
        return run.value

    # -- API ----------------------------------------------------------------------------

    def start(
        self,
        task: str,
        platform: str,
        screen: tuple[int, int] | dict[str, int],
        coord_space: str = "screen_px",
        *,
        frame: tuple[int, int] | dict[str, int] | None = None,
        action_format: str = "auto",
        policy_id: str | None = None,
        volatile_regions: list[list[int]] | None = None,
    ) -> Session:
        """Open a session. Never raises: when the gateway is down, the session is created
        lazily at the next call (and that call fails open until it is)."""
        body = session_body(
            task, platform, screen, coord_space, frame, action_format, policy_id, volatile_regions
        )
        state = SessionState(self.config, body, self._transport.deadlines)
        self._drive(state.start_request())
        return Session(self, state)

    def ready(self) -> bool:
        """Whether the gateway reports ready (``GET /readyz``); False on any failure."""
        return bool(self._drive(ready_request(self.config)))

    def diagnose(self, path: str) -> Job:
        """Start a diagnosis of a trace / OSWorld result folder / trajectories file."""
        return self._drive(diagnose_request(self.config, path))

    def job(self, job_id: str) -> Job:
        """Poll a diagnosis job."""
        return self._drive(job_request(self.config, job_id))

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> CriticClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session(SessionView):
    """One episode's gateway session (sync). Every method fails open."""

    _client: CriticClient

    def observe(
        self, step_idx: int, png: ImageInput, prev_action: ActionInput | None = None
    ) -> Observation:
        """Send screen ``step_idx`` and the action executed at ``step_idx - 1``."""
        return self._client._drive(self._state.observe_request(step_idx, png, prev_action))

    def critique(
        self,
        step_idx: int,
        action: ActionInput | None = None,
        candidates: list[ActionInput] | None = None,
        *,
        png: ImageInput | None = None,
        return_image: bool = False,
        return_thinking: bool = False,
    ) -> Verdict | Ranking:
        """Judge ``action`` (a ``Verdict``) or all ``candidates`` (a ``Ranking``) at the latest
        observed step."""
        request = self._state.critique_request(
            step_idx, action, candidates, png, return_image, return_thinking
        )
        return self._client._drive(request)

    def reseed(self, echo: dict[str, Any]) -> bool:
        """Replace the gateway's history with an earlier ``echo`` (R3 Restore); True on
        success. The next observe continues from ``echo["step_idx"] + 1``."""
        return self.reseed_status(echo) == "rebuilt"

    def reseed_status(self, echo: dict[str, Any]) -> ReseedStatus:
        """``reseed`` with its three outcomes: ``rebuilt`` (continue from the echo's step),
        ``untouched`` (the gateway's history is as it was) or ``lost`` (the session is
        re-created as it was before the reseed at the next call; numbering unchanged)."""
        return self._client._drive(self._state.reseed_request(echo))

    def close(self, outcome: str | None = None) -> bool:
        """Close the gateway session; True when the gateway confirmed.

        Args:
            outcome: ``success`` or ``failure``: the task's evaluated outcome, recorded in the
                session's trace for ``data_gen ingest-runs`` (leave it out when unknown).
        """
        return bool(self._client._drive(self._state.close_request(outcome)))
