"""Observe and critique: the history update of an executed step, verdicts on proposed ones.

``StepService`` answers the session routes (``/v1/sessions/{sid}/observe`` and ``/critique``,
each holding its session through ``SessionService.hold`` and filing its answer for retries) and
their stateless twins (``/v1/observe``, ``/v1/critique``, a throwaway session from the body).
Answers are ``serve.protocol`` objects; what only the trace needs (prompts, raw model output)
travels beside them in the trace event.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import time
from dataclasses import dataclass, field
from typing import Any

from hivig.actions import ActionError, action_from_arguments, pointer_after, space_for_platform
from hivig.contracts import INITIAL_HISTORY, CritiqueOutput, HistoryOutput, parse_history
from hivig.messages import ArrowMark
from hivig.prompts import format_trajectory
from hivig.recovery import StepRecord, choose_recovery
from serve.actions import CoordinateSpace, ResolvedAction, resolve
from serve.config import ServeConfig
from serve.critic import Critic, ModelResult, QueueGate
from serve.errors import ApiError
from serve.images import StoredImage
from serve.metrics import Metrics
from serve.protocol import (
    Critique,
    CritiqueAnswer,
    CritiqueStateless,
    HistoryText,
    Observe,
    ObserveAnswer,
    ObserveStateless,
    RankedAnswer,
    VerdictAnswer,
    dump_answer,
)
from serve.ranking import rank
from serve.recurrence_state import Detector, fired
from serve.services.answers import Versions, flag_trace, trace_event
from serve.services.images import ImageService
from serve.services.sessions import SessionService, new_state
from serve.sessions import SessionState, StoredResponse, now
from serve.traces import TraceWriter, messages_json

_RETRYABLE = ("timeout", "backend", "missing_image")
_GROUNDING = "Grounding/Spatial Error"
_OFF_SCREEN = (
    "The proposed target lies outside the visible screen, so the step cannot act on any element "
    "shown; pointer actions must target a point inside the current screenshot."
)


@dataclass
class Timer:
    """Milliseconds of each phase of a request."""

    start: float

    def total(self) -> float:
        """Milliseconds since the request started."""
        return round((time.perf_counter() - self.start) * 1000, 2)


@dataclass
class Judged:
    """One proposal judged: its verdict, and the model's raw answer for the trace."""

    verdict: VerdictAnswer
    raw_output: str | None = None


@dataclass
class Proposals:
    """The proposals of one critique as resolved, marked and prompted."""

    resolved: list[ResolvedAction]
    marks: list[list[Any]]
    messages: list[Any] = field(default_factory=list)


class StepService:
    """Observe and critique, in a session or stateless."""

    def __init__(
        self,
        cfg: ServeConfig,
        sessions: SessionService,
        images: ImageService,
        critic: Critic,
        queue: QueueGate,
        traces: TraceWriter,
        metrics: Metrics,
        versions: Versions,
    ) -> None:
        """Steps of the sessions in ``sessions``, judged by ``critic``."""
        self.cfg = cfg
        self.sessions = sessions
        self.images = images
        self.critic = critic
        self.queue = queue
        self.traces = traces
        self.metrics = metrics
        self.versions = versions
        # A decoded detector state holds up to about a megabyte (its JSON and thumbnails): keep
        # one for each session whose frames are likely still cached (about two per session).
        self.detector = Detector(cache_size=max(1, cfg.sessions.frame_cache // 4))

    # -- observe -------------------------------------------------------------------------------

    async def observe(self, sid: str, req: Observe) -> ObserveAnswer:
        """``POST /v1/sessions/{sid}/observe``: the history update of the executed step."""
        timer = Timer(time.perf_counter())
        k = req.step_idx
        digest = _observe_key(req)
        store = self.sessions.store
        async with self.sessions.hold(sid):
            state = self.sessions.open(sid)
            if k <= state.step_idx and not req.force:
                stored = store.response(sid, "observe", k, "")
                if stored is not None:
                    # A retry gets the stored answer; another screenshot or action for a step
                    # already observed is a conflict, never silently dropped.
                    if not await self._same_observe(req, digest, stored):
                        raise ApiError(
                            409,
                            "step_conflict",
                            f"step_idx {k} was observed with another screenshot or action; "
                            "send `force: true` to replace it",
                        )
                    replayed = ObserveAnswer.model_construct(**stored.body)
                    flag_trace(self.traces, replayed, sid)
                    return replayed
            expected = state.step_idx + 1
            if k != expected and not req.force:
                raise ApiError(409, "step_conflict", f"expected step_idx {expected}, got {k}")
            shot = await self.images.image(req.screenshot, req.image_ref)
            if shot is None:
                raise ApiError(422, "bad_request", "observe needs `screenshot` or `image_ref`")
            if k <= state.step_idx:  # forced back to an earlier step: later steps are undone
                rewind(state, k)
            prev_shot = await self.images.image(req.prev_screenshot, req.prev_image_ref)
            if prev_shot is not None and k > 0:
                state.screens[str(k - 1)] = prev_shot.ref
            answer, event = await self._observe(state, k, shot, req.prev_action, timer)
            if k > expected:
                _mark_gap(state, answer, event, expected, k)
            # Retries only ever ask for the latest steps again: older answers are dropped.
            stored = StoredResponse("observe", k, "", dump_answer(answer), request=digest)
            store.save(state, stored, prune_before=k - 1)
            trace_event(self.traces, answer, sid, "observe", **event)
            return answer

    async def _same_observe(self, req: Observe, digest: str, stored: StoredResponse) -> bool:
        """Whether ``req`` states what the stored answer of its step answered.

        The screenshot is compared by its reference, known only once decoded: a retry pays for
        that, a first observe does not (its key leaves the screenshot out).
        """
        if stored.request is not None and stored.request != digest:
            return False
        if req.image_ref is not None and req.screenshot is None:
            return req.image_ref == stored.body.get("image_ref")
        shot = await self.images.image(req.screenshot, req.image_ref)
        return shot is None or shot.ref == stored.body.get("image_ref")

    async def _observe(
        self,
        state: SessionState,
        k: int,
        shot: StoredImage,
        prev: Any,
        timer: Timer,
        *,
        stateless: bool = False,
    ) -> tuple[ObserveAnswer, dict[str, Any]]:
        before = state.screens.get(str(k - 1)) if k > 0 else None
        executed: ResolvedAction | None = None
        result: ModelResult | None = None
        prompt: list[dict[str, Any]] = []
        if k > 0:
            if prev is None:
                raise ApiError(422, "bad_action", "observe of step_idx > 0 needs `prev_action`")
            executed = resolve(
                prev, state.platform, session_coordinates(state), state.action_format
            )
        # The detector reads the new screen and its own state only, never the history: it
        # runs on an image thread while the history call waits for the model.
        detect = asyncio.create_task(
            self.images.cpu(self._detect, state, shot.ref, _detector_actions(executed))
        )
        try:
            if executed is not None and before is not None:
                result, prompt = await self._history(state, before, shot.ref, executed)
            if executed is not None:
                self._append_step(state, k - 1, executed, before)
        except BaseException:
            detect.cancel()  # its outcome is not wanted (nor logged as never retrieved)
            raise
        signals = await detect
        for name in fired(signals):
            self.metrics.recurrence.labels(name).inc()
        state.screens[str(k)] = shot.ref
        state.step_idx = k
        state.last_seen = now()
        if executed is not None and signals.change is not None:
            state.steps[-1]["changed"] = not signals.change["no_effect"]
        recovery = choose_recovery(_step_records(state), task=state.task)
        if recovery is not None:
            self.metrics.recurrence.labels("recovery").inc()
        status = "degraded" if result is not None and result.status != "ok" else "ok"
        reason = result.reason if result is not None else None
        timing = {"model": result.model_ms if result is not None else 0.0, "total": timer.total()}
        session = {} if stateless else {"session_id": state.session_id}
        answer = ObserveAnswer.model_construct(
            **session,
            step_idx=k,
            status=status,
            reason=reason,
            history=state.history_json(),
            image_ref=shot.ref,
            change=signals.change,
            recurrence=signals.recurrence,
            recovery=recovery.to_dict() if recovery is not None else None,
            echo=state.echo(),
            timing_ms=timing,
            usage=result.usage if result is not None else {"prompt": 0, "completion": 0},
            **self.versions(),
        )
        event = {
            "step_idx": k,
            "image_ref": shot.ref,
            "prev_image_ref": before,
            "prev_action": executed.to_trace() if executed is not None else None,
            "prompt": prompt,
            "raw_output": result.raw_output if result is not None else None,
            "reasoning": result.reasoning if result is not None else None,
            "history": state.history_json(),
            "change": signals.change,
            "recurrence": signals.recurrence,
            "status": status,
            "reason": reason,
            "timing_ms": timing,
        }
        return answer, event

    async def _history(
        self, state: SessionState, before: str, after: str, executed: ResolvedAction
    ) -> tuple[ModelResult, list[dict[str, Any]]]:
        """The history update of an executed step: the model's result and the prompt sent."""
        if not self.images.store.has(before):
            # Known by reference only (a session re-created on another gateway): the history
            # update needs both screens, so it is skipped, openly, and the history kept.
            self.metrics.degraded.labels("observe", "missing_before").inc()
            state.stale = True
            return ModelResult(status="degraded", reason="missing_before"), []
        space = space_for_platform(state.platform)
        # The first update reads the profile's own opening summary (hivig's is the state's); a
        # profile may feed the model's own words back instead of the parsed record.
        previous = state.summary_text or state.summary
        if previous == INITIAL_HISTORY.summary:
            previous = self.critic.initial_summary
        messages = self.critic.history_messages(
            state.task, state.platform, previous, before, after, executed.step_text(space)
        )
        result = await self.critic.history(messages)
        self._apply_history(state, result)
        return result, messages_json(list(messages))

    def _detect(self, state: SessionState, ref: str, actions: list[Any] | None) -> Any:
        return self.detector.update(state, self.images.store.clean_frame(ref), actions)

    def _apply_history(self, state: SessionState, result: ModelResult) -> None:
        if isinstance(result.parsed, HistoryOutput):
            state.progress = result.parsed.progress
            state.last_result = result.parsed.last_result
            state.summary_text = self.critic.summary_to_feed(result.raw_output)
            state.history_version += 1
            state.stale = False
        else:
            # The previous history stays, flagged: the policy still gets a history.
            state.stale = True

    def _append_step(
        self, state: SessionState, index: int, executed: ResolvedAction, image_ref: str | None
    ) -> None:
        space = space_for_platform(state.platform)
        actions = [a.to_arguments() for a in executed.actions] if executed.actions else None
        state.steps.append(
            {
                "step_idx": index,
                "intent": executed.intent,
                "action_text": executed.tool_calls,
                "step_text": executed.step_text(space),
                "image_ref": image_ref,
                "last_action_result": state.last_result if not state.stale else None,
                "progress_summary": state.progress,
                "actions": actions,
            }
        )
        if executed.actions:
            start = tuple(state.pointer) if state.pointer else None
            moved = pointer_after(executed.actions, start)  # type: ignore[arg-type]
            state.pointer = list(moved) if moved is not None else None

    # -- critique ------------------------------------------------------------------------------

    async def critique(self, sid: str, req: Critique) -> CritiqueAnswer | RankedAnswer:
        """``POST /v1/sessions/{sid}/critique``: verdict(s) on the proposed step(s)."""
        timer = Timer(time.perf_counter())
        k = req.step_idx
        store = self.sessions.store
        async with self.sessions.hold(sid):
            state = self.sessions.open(sid)
            # The key names the screen too: a session re-seeded from an earlier echo (an R3
            # Restore) reaches step k again on another screen, and must not get the old answer.
            key = _request_key(req, state.screens.get(str(k)))
            stored = store.response(sid, "critique", k, key)
            if stored is not None:
                replayed = _critique_answer(stored.body)
                flag_trace(self.traces, replayed, sid)
                return replayed
            if k != state.step_idx:
                raise ApiError(
                    409,
                    "step_conflict",
                    f"critique step_idx {k} but the latest observed is {state.step_idx}",
                )
            shot = await self.images.image(req.screenshot, req.image_ref)
            ref = shot.ref if shot is not None else state.screens.get(str(k))
            if ref is None:
                raise ApiError(422, "bad_request", "no screenshot for this step: observe it first")
            answer, event, judged = await self._critique(state, ref, req, timer)
            state.last_seen = now()
            # A verdict lost to a timeout or a backend failure is not filed: a retry may get a
            # real one (a critique changes no session state, so nothing is applied twice).
            keep = not any(j.verdict.reason in _RETRYABLE for j in judged)
            filed = StoredResponse("critique", k, key, dump_answer(answer)) if keep else None
            store.save(state, filed)
            trace_event(self.traces, answer, sid, "critique", step_idx=k, **event)
            return answer

    async def _critique(
        self,
        state: SessionState,
        ref: str,
        req: Critique | CritiqueStateless,
        timer: Timer,
        *,
        stateless: bool = False,
    ) -> tuple[CritiqueAnswer | RankedAnswer, dict[str, Any], list[Judged]]:
        proposals = self._proposals(state, ref, req)
        pairs = zip(proposals.resolved, proposals.messages, strict=True)
        model_jobs = [m for r, m in pairs if not r.out_of_frame]
        self.queue.check(len(model_jobs))
        results = await asyncio.gather(*(self.critic.critique(m) for m in model_jobs))
        it = iter(results)
        judged = []
        for r, marks in zip(proposals.resolved, proposals.marks, strict=True):
            result = None if r.out_of_frame else next(it)
            one = self._verdict(state, r, marks, result, req.return_thinking)
            if req.return_image:
                one.verdict.annotated_image = await self.images.cpu(
                    self.images.store.annotated_image, ref, marks, state.platform
                )
            judged.append(one)
        recurrence = self.detector.last_recurrence(state)
        for j in judged:
            j.verdict.recurrence = recurrence
        echo = {} if stateless else {"echo": state.echo()}
        timing = {"total": timer.total()}
        common = {
            "history_version": state.history_version,
            **echo,
            "timing_ms": timing,
            **self.versions(),
        }
        verdicts = [j.verdict for j in judged]
        event = {
            "image_ref": ref,
            "actions": [r.to_trace() for r in proposals.resolved],
            "marks": [[_mark_json(m) for m in marks] for marks in proposals.marks],
            "prompt": messages_json(list(proposals.messages[0])),
            "raw_outputs": [j.raw_output for j in judged],
            "verdicts": [dump_answer(v) for v in verdicts],
            "timing_ms": timing,
        }
        if req.candidates is not None:
            ranking = rank([(v.verdict, v.confidence) for v in verdicts])
            answer: CritiqueAnswer | RankedAnswer = RankedAnswer.model_construct(
                results=verdicts, ranking=ranking, **common
            )
        else:
            answer = CritiqueAnswer.model_construct(**dump_answer(verdicts[0]), **common)
        return answer, event, judged

    def _proposals(
        self, state: SessionState, ref: str, req: Critique | CritiqueStateless
    ) -> Proposals:
        """The request's proposals resolved in the session's frame, with their marks and the
        verdict prompt of each."""
        items = _proposed(req, self.cfg.limits.max_candidates)
        frame = session_coordinates(state)
        resolved = [resolve(a, state.platform, frame, state.action_format) for a in items]
        trajectory = format_trajectory([s["step_text"] for s in state.steps])
        note = self.detector.note(state) if self.critic.recurrence_note else None
        if note:
            trajectory = f"{trajectory}\n\n{note}" if trajectory else note
        # A profile without drag arrows marks only drags that name both ends.
        drag_arrows = self.images.store.policy.drag_arrows
        pointer = tuple(state.pointer) if state.pointer and drag_arrows else None
        space = space_for_platform(state.platform)
        out = Proposals(resolved, [r.marks(pointer) for r in resolved])  # type: ignore[arg-type]
        for r, marks in zip(resolved, out.marks, strict=True):
            out.messages.append(
                self.critic.critique_messages(
                    state.task, state.platform, trajectory, ref, marks, r.step_text(space)
                )
            )
        return out

    def _verdict(
        self,
        state: SessionState,
        r: ResolvedAction,
        marks: list[Any],
        result: ModelResult | None,
        return_thinking: bool,
    ) -> Judged:
        base: dict[str, Any] = {
            "marker": _marker(marks, state),
            "action_text": r.tool_calls,
            "parse_error": r.error,
            "thinking": None,
            "confidence": None,
            "annotated_image": None,
        }
        if result is None:  # out of frame: a rule answers, not the model
            self.metrics.rejected_coords.labels(state.coord_space).inc()
            self._count("bad", _GROUNDING, state.platform)
            rule = VerdictAnswer.model_construct(
                **base,
                status="ok",
                verdict="bad",
                source="rule",
                reason="out_of_frame",
                error_dimension=_GROUNDING,
                explanation=_OFF_SCREEN,
                parse_status="ok",
                truncated=False,
                usage={"prompt": 0, "completion": 0},
                model_ms=0.0,
                recurrence=None,
            )
            return Judged(rule)
        parsed = result.parsed if isinstance(result.parsed, CritiqueOutput) else None
        verdict = parsed.verdict.lower() if parsed is not None else "abstain"
        dimension = parsed.dimension.name if parsed is not None and parsed.dimension else None
        self._count(verdict, dimension, state.platform)
        limit = self.cfg.critic.explanation_max_chars
        if return_thinking and parsed is not None:
            base["thinking"] = parsed.think
        judged = VerdictAnswer.model_construct(
            **base,
            status=result.status,
            verdict=verdict,
            source="model" if parsed is not None else "fallback",
            reason=result.reason,
            error_dimension=dimension,
            explanation=parsed.explanation[:limit] if parsed is not None else "",
            parse_status=result.parse_status,
            truncated=result.truncated,
            usage=result.usage,
            model_ms=result.model_ms,
            recurrence=None,
        )
        return Judged(judged, result.raw_output)

    def _count(self, verdict: str, dimension: str | None, platform: str) -> None:
        self.metrics.verdicts.labels(verdict, platform).inc()
        if dimension:
            self.metrics.dimensions.labels(dimension, platform).inc()

    # -- stateless -----------------------------------------------------------------------------

    async def observe_stateless(self, req: ObserveStateless) -> ObserveAnswer:
        """``POST /v1/observe``: a history update with the caller's history and screenshots."""
        timer = Timer(time.perf_counter())
        state = new_state(req, "stateless")
        if req.previous_summary is not None:
            seed_summary(state, req.previous_summary)
        before = await self.images.image(req.before, req.before_ref)
        after = await self.images.image(req.after, req.after_ref)
        if after is None:
            raise ApiError(422, "bad_request", "observe needs `after` (or `after_ref`)")
        k = 0
        if before is not None:
            state.screens["0"] = before.ref
            state.step_idx, k = 0, 1
        answer, _ = await self._observe(state, k, after, req.prev_action, timer, stateless=True)
        return answer

    async def critique_stateless(self, req: CritiqueStateless) -> CritiqueAnswer | RankedAnswer:
        """``POST /v1/critique``: a verdict with the caller's trajectory and screenshot."""
        timer = Timer(time.perf_counter())
        state = new_state(req, "stateless")
        for i, step in enumerate(req.trajectory):
            executed = resolve(
                step, state.platform, session_coordinates(state), state.action_format
            )
            self._append_step(state, i, executed, None)
        shot = await self.images.image(req.screenshot, req.image_ref)
        if shot is None:
            raise ApiError(422, "bad_request", "critique needs `screenshot` or `image_ref`")
        self.detector.reset(state)
        answer, _, _ = await self._critique(state, shot.ref, req, timer, stateless=True)
        return answer

    # -- warm-up -------------------------------------------------------------------------------

    async def warm_up(self) -> str:
        """Run one history update and one verdict on a blank screen; a readiness detail.

        The backend must answer both; whether the answers parse is reported, not required (a
        tiny random model never writes the contract, a trained one does).
        """
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (640, 400), (236, 236, 236)).save(buf, format="PNG")
        ref = (await self.images.cpu(self.images.store.put_bytes, buf.getvalue())).ref
        platform, task = "ubuntu", "Warm-up: check that the critic answers."
        history = self.critic.history_messages(
            task, platform, self.critic.initial_summary, ref, ref, "<tool_call>\n{}\n</tool_call>"
        )
        critique = self.critic.critique_messages(
            task, platform, "", ref, [], "<tool_call>\n{}\n</tool_call>"
        )
        h = await self.critic.history(history)
        c = await self.critic.critique(critique)
        failed = [r.reason for r in (h, c) if r.reason in ("timeout", "backend")]
        if failed:
            raise RuntimeError(f"backend did not answer the warm-up ({', '.join(failed)})")
        return f"ready (warm-up parse: history {h.parse_status}, critique {c.parse_status})"


# ---------------------------------------------------------------------------------------------
# Session state for a step


def rewind(state: SessionState, k: int) -> None:
    """Undo everything from step ``k - 1`` on, so a forced observe of ``k`` replaces it.

    The history, pointer and screens go back to what they were after step ``k - 2``; the
    recurrence detector starts afresh (its state is not kept per step).
    """
    state.steps = [s for s in state.steps if s["step_idx"] < k - 1]
    state.screens = {j: r for j, r in state.screens.items() if int(j) < k}
    last = state.steps[-1] if state.steps else None
    if last is None or last.get("last_action_result") is None:
        state.progress, state.last_result = INITIAL_HISTORY.progress, INITIAL_HISTORY.last_result
    else:
        state.progress = str(last.get("progress_summary") or state.progress)
        state.last_result = str(last["last_action_result"])
    state.stale = False
    state.summary_text = ""  # the record of step k - 2 is fed back from here
    state.step_idx = k - 1
    actions = [
        a
        for step in state.steps
        for a in (action_from_arguments(x) for x in step.get("actions") or [])
        if not isinstance(a, ActionError)
    ]
    pointer = pointer_after(actions) if actions else None
    state.pointer = list(pointer) if pointer is not None else None
    state.detector, state.signals = None, None


def seed_summary(state: SessionState, summary: str | HistoryText) -> None:
    """Stateless observe: the caller's previous history (text or the ``history`` object)."""
    if isinstance(summary, HistoryText):
        state.progress, state.last_result = summary.progress_summary, summary.last_action_result
        return
    parsed = parse_history(f"<think>-</think><summary>{summary}</summary>")
    if isinstance(parsed, HistoryOutput):
        state.progress, state.last_result = parsed.progress, parsed.last_result
    elif summary.strip():
        raise ApiError(
            422,
            "bad_request",
            "`previous_summary` needs 'Progress Summary:' and 'Last Action Result:' lines",
        )


def session_coordinates(state: SessionState) -> CoordinateSpace:
    """The session's coordinate frame."""
    return CoordinateSpace(
        state.coord_space, state.frame_w or state.screen_w, state.frame_h or state.screen_h
    )


def _critique_answer(body: dict[str, Any]) -> CritiqueAnswer | RankedAnswer:
    """A filed critique answer as its object again (``results``: the ranked form)."""
    if "results" in body:
        return RankedAnswer.model_construct(**body)
    return CritiqueAnswer.model_construct(**body)


def _observe_key(req: Observe) -> str:
    """What an observe states besides its screenshot (compared by reference on a retry)."""
    text = req.model_dump_json(include={"prev_action", "prev_screenshot", "prev_image_ref"})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _mark_gap(
    state: SessionState, answer: ObserveAnswer, event: dict[str, Any], expected: int, k: int
) -> None:
    """A forced observe past missing steps: the history lacks them, so it is flagged stale."""
    state.stale = True
    history = state.history_json()
    answer.status, answer.reason, answer.echo = "degraded", "history_gap", state.echo()
    answer.history = history  # type: ignore[assignment]
    event.update(
        status="degraded", reason="history_gap", history=history, missing_steps=[expected, k - 1]
    )


def _proposed(req: Critique | CritiqueStateless, limit: int) -> list[Any]:
    if req.candidates is None:
        return [req.action]
    if len(req.candidates) > limit:
        raise ApiError(422, "bad_action", f"at most {limit} candidates per critique")
    return req.candidates


def _request_key(req: Critique, screen: str | None) -> str:
    """Idempotency key of a critique: what is judged, on which screen."""
    keep: dict[str, Any] = {
        "action": req.action,
        "candidates": req.candidates,
        "image_ref": req.image_ref,
        "return_thinking": req.return_thinking,
        "screen": screen,
    }
    if req.screenshot:
        keep["screenshot"] = hashlib.sha256(str(req.screenshot).encode()).hexdigest()
    # Its serialisation is part of the stored sessions: a retry after an upgrade must find the
    # answer the earlier version stored, so this key keeps its own bytes (pinned by a test).
    text = json.dumps(keep, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _step_records(state: SessionState) -> list[StepRecord]:
    """The executed steps as ReTrace records: the screen each step led to, and how it went."""
    records = [StepRecord(0, state.screens.get("0", ""), progress_summary=None)]
    for step in state.steps:
        k = step["step_idx"] + 1
        ref = state.screens.get(str(k))
        if ref is None:
            continue
        records.append(
            StepRecord(
                k,
                ref,
                step.get("last_action_result"),
                action_text=step.get("action_text"),
                intent=step.get("intent"),
                progress_summary=step.get("progress_summary"),
                changed=step.get("changed"),
            )
        )
    return [r for r in records if r.image_ref]


def _detector_actions(executed: ResolvedAction | None) -> list[Any] | None:
    """What the detector compares: typed actions, or the raw text when the parse failed."""
    if executed is None:
        return None
    return list(executed.actions) if executed.actions else [executed.raw]


def _mark_json(mark: Any) -> dict[str, Any]:
    if isinstance(mark, ArrowMark):
        return {"shape": "arrow", "x": mark.x1, "y": mark.y1, "x2": mark.x2, "y2": mark.y2}
    return {"shape": "x", "x": mark.x, "y": mark.y}


def _marker(marks: list[Any], state: SessionState) -> dict[str, Any] | None:
    """The ``marker`` field: the step's main mark on the grid and in screen pixels."""
    if not marks:
        return None
    # A drag's arrow is the gesture (its move-to-start X is only where it begins).
    arrows = [m for m in marks if isinstance(m, ArrowMark)]
    m = arrows[-1] if arrows else marks[0]
    frame = CoordinateSpace("screen_px", state.screen_w, state.screen_h)
    if isinstance(m, ArrowMark):
        x_px, y_px = frame.from_grid(m.x1, m.y1)
        x2_px, y2_px = frame.from_grid(m.x2, m.y2)
        return {
            "x_1000": m.x1,
            "y_1000": m.y1,
            "x_px": x_px,
            "y_px": y_px,
            "x2_1000": m.x2,
            "y2_1000": m.y2,
            "x2_px": x2_px,
            "y2_px": y2_px,
            "shape": "arrow",
        }
    x_px, y_px = frame.from_grid(m.x, m.y)
    return {"x_1000": m.x, "y_1000": m.y, "x_px": x_px, "y_px": y_px, "shape": "x"}
