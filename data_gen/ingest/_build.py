"""Second pass of ingest: trajectory reconstruction, normalisation and cross-file copies.

Per file, records attach to open trajectories, steps are normalised to
Qwen3-VL actions and their screenshots checked. Across files, copies of one episode (same
trajectory id) are reduced to one.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from data_gen.ingest._images import ImageResolver
from data_gen.ingest._parse import (
    Entry,
    IngestConfig,
    Record,
    file_scale,
    history_matches,
    normalise_space,
)
from data_gen.quarantine import Ledger
from hivig.actions import ActionError, CallUser, Terminate, normalise_calls, pointer_after
from hivig.trajectory import Source, Step, Trajectory, episode_key, trajectory_id

LONG_OPERATION_WORDS = 40
"""Operations longer than this are flagged (they tend to describe the screen, not the action)."""

# Action errors that keep their own code in the quarantine; everything else is ``bad_action``.
_OWN_REASONS = frozenset({"coordinate_out_of_range", "ambiguous_scale"})
_TICK = 1024  # lines between progress-bar updates (tqdm's own cost stays out of the profile)


@dataclass
class _Open:
    """A trajectory under reconstruction."""

    key: tuple[str, str]
    first_line: int
    width: int
    height: int
    steps: list[Step] = field(default_factory=list)
    operations: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    """Input lines of the kept steps (a dropped cross-file copy re-counts them)."""
    cut: tuple[str, int] | None = None
    """(reason, line) of the step that ended the trajectory early, if one did."""
    pointer: tuple[int, int] | None = None

    @property
    def broken(self) -> bool:
        return self.cut is not None


@dataclass
class Built:
    """One reconstructed trajectory and what cross-file de-duplication needs to know of it."""

    traj: dict
    """The ``trajectories.jsonl`` object."""
    file: str
    lines: list[int]
    cut: tuple[str, int] | None

    @property
    def id(self) -> str:
        return self.traj["id"]

    def preference(self) -> tuple:
        """Sort key of copies of one trajectory, best first."""
        has_think = any(s.get("think") for s in self.traj["steps"])
        return (not has_think, -len(self.traj["steps"]), self.file, self.lines[0])


# ------------------------------------------------------------------------ second pass


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def episode_of(entry: Entry, folder: str) -> str:
    """Episode key: platform, image root and source folder.

    Built from what names the episode in every file that carries it, never from the screenshots
    one file happens to list: a navigation copy, a planning copy and a truncated copy of one
    episode must share the key, or they could land in different splits.
    """
    return episode_key(f"{entry.platform}:{entry.root}/{folder}", ())


@dataclass
class FileReport:
    """What ingest found in one annotation file."""

    lines: int = 0
    scale: str | None = None
    scale_tally: dict[str, int] = field(default_factory=dict)
    scale_conflicts: int = 0
    mixed_scale: bool = False
    trajectories: int = 0
    flags: Counter[str] = field(default_factory=Counter)


class FileIngest:
    """Second pass over one file: reconstruction, normalisation, image checks."""

    def __init__(
        self,
        entry: Entry,
        records: list[Record],
        ledger: Ledger,
        images: ImageResolver,
        cfg: IngestConfig,
        scroll_sign: int,
        report: FileReport,
    ) -> None:
        self.entry, self.records, self.ledger, self.images = entry, records, ledger, images
        self.cfg, self.scroll_sign, self.report = cfg, scroll_sign, report
        self.scale, report.scale_tally = file_scale(records)
        report.scale = self.scale

    def mine(self, rec: Record) -> bool:
        i, n = self.cfg.shard
        unit = rec.folder if rec.folder is not None else f"{self.entry.annotation}:{rec.line}"
        return n == 1 or _stable_hash(unit) % n == i

    def drop(self, rec: Record, reason: str, message: str) -> None:
        self.ledger.drop(self.entry.annotation, rec.line, reason, message)

    def run(self, tick: Callable[[int], object] | None = None) -> list[Built]:
        """Reconstruct the file's trajectories; ``tick(n)`` reports progress every n lines."""
        open_: dict[tuple[str, str], _Open] = {}
        done: list[_Open] = []
        seen: set[int] = set()
        for n, rec in enumerate(self.records, 1):
            if tick is not None and n % _TICK == 0:
                tick(_TICK)
            if not self.mine(rec):
                continue
            self.ledger.lines += 1
            self.report.lines += 1
            traj = self._attach(rec, open_, done, seen)
            if traj is None:
                continue
            problem = rec.error or self._step(rec, traj)
            if problem is not None:
                traj.cut = (problem[0], rec.line)
                self.drop(rec, *problem)
        if tick is not None:
            tick(len(self.records) % _TICK)
        out = [self._finish(t) for t in sorted(done, key=lambda t: t.first_line) if t.steps]
        self.report.trajectories = len(out)
        return out

    def _attach(self, rec: Record, open_: dict, done: list, seen: set[int]) -> _Open | None:
        """The trajectory ``rec`` continues, or ``None`` after recording why it is dropped."""
        if rec.folder is None:
            self.drop(rec, *rec.error)  # type: ignore[misc]
            return None
        if rec.raw_hash in seen:
            self.drop(rec, "duplicate", "line repeats an earlier line of this file")
            return None
        seen.add(rec.raw_hash)
        key, p = (rec.folder, rec.task), len(rec.history)
        traj = open_.get(key)
        if p == 0:
            traj = _Open(key, rec.line, rec.width, rec.height)
            open_[key] = traj
            done.append(traj)
            return traj
        if traj is None:
            self.drop(rec, "no_trajectory_start", f"step {p + 1} without an open trajectory")
        elif traj.broken:
            self.drop(rec, "after_bad_step", "an earlier step of this trajectory was rejected")
        elif p < len(traj.steps):
            self.drop(rec, "duplicate", f"trajectory already has a step at position {p}")
        elif p > len(traj.steps):
            traj.cut = ("history_gap", rec.line)
            self.drop(rec, "history_gap", f"positions {len(traj.steps)}..{p - 1} are missing")
        else:
            return traj
        return None

    def _step(self, rec: Record, traj: _Open) -> tuple[str, str] | None:
        """Validate and append one step; the (reason, message) when it is rejected."""
        for k, (said, did) in enumerate(zip(rec.history, traj.operations, strict=False)):
            if not history_matches(said, did):
                return "history_mismatch", f"history line {k + 1} differs from step {k + 1}"
        if (rec.width, rec.height) != (traj.width, traj.height):
            return (
                "screen_size_mismatch",
                f"{rec.width}x{rec.height} in a {traj.width}x{traj.height} trajectory",
            )
        flags: Counter[str] = Counter()
        actions = normalise_calls(
            rec.calls,
            self.entry.platform,
            rec.width,
            rec.height,
            self.scale,
            scroll_sign=self.scroll_sign,
            hswipe=self.cfg.hswipe,  # type: ignore[arg-type]
            pointer=traj.pointer,
            flags=flags,
        )
        if isinstance(actions, ActionError):
            if actions.reason == "ambiguous_scale":
                self.report.scale_conflicts += 1
            reason = actions.reason if actions.reason in _OWN_REASONS else "bad_action"
            return reason, f"{actions.reason}: {actions.message}"
        if any(isinstance(a, CallUser) for a in actions):
            return "call_user", "call_user() asks the user to take over; no tool call to learn"
        path, result = self.images.check(self.entry.root, rec.image, (rec.width, rec.height))
        if isinstance(result[0], str) and result[0] != "unchecked":
            return result  # type: ignore[return-value]
        # Data-quality counters: positional arguments, aliases,
        # and operations long enough to describe the screen rather than the action.
        flags.update(f"positional:{c.name}" for c in rec.calls if c.positional)
        flags.update(f"alias:{c.alias}" for c in rec.calls if c.alias)
        if len(rec.operation.split()) > LONG_OPERATION_WORDS:
            flags["long_operation"] += 1
        self.report.flags.update(flags)
        traj.steps.append(
            Step(len(traj.steps), path, rec.think, rec.operation, actions, rec.action_text)
        )
        # Operations keep their own quotes; only history lines lose their surrounding ones.
        traj.operations.append(normalise_space(rec.operation))
        traj.lines.append(rec.line)
        traj.pointer = pointer_after(actions, traj.pointer)
        self.ledger.kept += 1
        return None

    def _finish(self, t: _Open) -> Built:
        folder, task = t.key
        last = t.steps[-1].actions
        outcome = "unknown"
        if last and isinstance(last[-1], Terminate):
            outcome = "success" if last[-1].status == "success" else "failure"
        traj = Trajectory(
            id=trajectory_id(folder, task),
            episode_key=episode_of(self.entry, folder),
            source=Source(self.entry.key, self.entry.annotation),
            platform=self.entry.platform,
            task=task,
            screen_w=t.width,
            screen_h=t.height,
            steps=t.steps,
            outcome=outcome,  # type: ignore[arg-type]
        )
        return Built(traj.to_json(), self.entry.annotation, t.lines, t.cut)


def drop_copies(built: list[Built], ledger: Ledger) -> tuple[list[Built], list[dict]]:
    """One trajectory per id: the preferred copy stays, the others' steps become ``duplicate``.

    The trajectory id hashes source folder and task, so a navigation and a planning_cot copy of one
    episode share it, and downstream steps refuse a repeated id. The kept copy is the one with
    ``<think>`` reasoning, then the longer one; the others' kept lines move from
    ``kept`` to ``duplicate`` so ``lines == kept + Σ dropped`` still holds.

    Returns:
        The kept trajectories in input order, and one report row per dropped copy.
    """
    by_id: dict[str, list[Built]] = {}
    for b in built:
        by_id.setdefault(b.id, []).append(b)
    losers: set[int] = set()
    rows = []
    for copies in by_id.values():
        if len(copies) < 2:
            continue
        best, *rest = sorted(copies, key=Built.preference)
        for b in rest:
            losers.add(id(b))
            ledger.kept -= len(b.lines)
            for line in b.lines:
                ledger.drop(
                    b.file, line, "duplicate", f"copy of trajectory {b.id} kept from {best.file}"
                )
            rows.append({"id": b.id, "dropped": b.file, "kept": best.file})
    return [b for b in built if id(b) not in losers], rows
