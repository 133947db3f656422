"""What the stages know about one step of a trajectory: a typed record, and its work-file form.

Every stage reads and fills a ``StepUnit`` in place; the fields, in stage order:

- ``transition``: the state transition of the step (``transitions``)
- ``history``: the history sample of the pair (step, step + 1) (``history``)
- ``bad``: the perturbed step planned for the step, or a failed run's real Bad (``perturb``)
- ``judge``: the double-blind verdict on that Bad step (``judge``)
- ``critique``: the Good and Bad critique samples, by id (``rationale``)

Samples are ``SFTRecord``s from the moment a stage writes them; the export writes them as they
are. Units become JSON only where the executor stores a stage's output
(``work/<shard>/<stage>.jsonl``), and the JSON keeps the layout those files have always had,
so a run resumes from work files written before the units were typed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from data_gen.perturb import BadStep
from hivig.messages import ChatMessage, ImagePart, ImageRef, TextPart, mark_from_json, mark_to_json
from hivig.records import (
    Labels,
    Provenance,
    RecordError,
    SFTRecord,
    record_from_messages,
    record_messages,
)


@dataclass(frozen=True)
class Transition:
    """What an executed step changed on the screen (the rationale prompts' hidden context)."""

    next_state: str
    """The annotator's description of the next state, or ``TERMINAL_STATE`` at the end."""
    mechanism: str | None = None
    """``[Action Mechanism]`` of the answer; ``None`` for a final step."""
    effect: str | None = None
    """``[Structural Effect]`` of the answer; ``None`` for a final step."""
    think: str | None = None
    """The answer's reasoning."""
    no_change: bool = False
    """The before and after screenshots are identical (or the episode ends here)."""
    terminal: bool = False
    """The step ends the episode; nothing was asked."""
    prompt_version: str | None = None
    """Id of the transition prompt; ``None`` for a final step (no request)."""
    request_hashes: tuple[str, ...] = ()
    """The annotator requests behind the answer."""

    def to_json(self) -> dict[str, Any]:
        """The work-file form (a final step's has no ``prompt_version``)."""
        out: dict[str, Any] = {
            "next_state": self.next_state,
            "mechanism": self.mechanism,
            "effect": self.effect,
            "think": self.think,
            "no_change": self.no_change,
            "terminal": self.terminal,
            "request_hashes": list(self.request_hashes),
        }
        if self.prompt_version is not None:
            out["prompt_version"] = self.prompt_version
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Transition:
        """Inverse of ``to_json``."""
        return cls(
            next_state=obj["next_state"],
            mechanism=obj.get("mechanism"),
            effect=obj.get("effect"),
            think=obj.get("think"),
            no_change=obj.get("no_change", False),
            terminal=obj.get("terminal", False),
            prompt_version=obj.get("prompt_version"),
            request_hashes=tuple(obj.get("request_hashes", ())),
        )


@dataclass(frozen=True)
class JudgeVerdict:
    """The judge's decision on a step's Bad step.

    Three shapes: ``skipped`` (the judge is disabled; accepted unjudged), a ``reason`` (no
    usable answer; the Bad is dropped), or an answer (``expert_slot``, ``better`` and the
    named ``dimension``), accepted or not.
    """

    accepted: bool
    """The Bad step goes on to the rationale stage."""
    vetoes_good: bool = False
    """The judge preferred the Bad step: the expert step is doubtful, its Good is dropped."""
    skipped: bool = False
    """``judge.enabled`` is false: accepted without a request."""
    reason: str | None = None
    """Why no verdict came back (the annotator's drop reason)."""
    expert_slot: str | None = None
    """``A`` or ``B``: where the expert step (or a real Bad's correction) was shown."""
    better: str | None = None
    """The candidate the judge preferred."""
    dimension: str | None = None
    """The dimension the judge named."""
    prompt_version: str | None = None
    """Id of the judge prompt."""
    request_hashes: tuple[str, ...] = ()
    """The annotator requests behind the answer."""

    def to_json(self) -> dict[str, Any]:
        """The work-file form (also what an exclusion message quotes, in this key order)."""
        if self.skipped:
            return {"accepted": self.accepted, "skipped": True}
        if self.reason is not None:
            return {"accepted": self.accepted, "reason": self.reason}
        return {
            "expert_slot": self.expert_slot,
            "better": self.better,
            "dimension": self.dimension,
            "request_hashes": list(self.request_hashes),
            "prompt_version": self.prompt_version,
            "accepted": self.accepted,
            "vetoes_good": self.vetoes_good,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> JudgeVerdict:
        """Inverse of ``to_json``."""
        return cls(
            accepted=bool(obj.get("accepted")),
            vetoes_good=bool(obj.get("vetoes_good")),
            skipped=bool(obj.get("skipped")),
            reason=obj.get("reason"),
            expert_slot=obj.get("expert_slot"),
            better=obj.get("better"),
            dimension=obj.get("dimension"),
            prompt_version=obj.get("prompt_version"),
            request_hashes=tuple(obj.get("request_hashes", ())),
        )


@dataclass
class StepUnit:
    """One step's annotations, filled in by the stages (see the module docstring)."""

    index: int
    """The step's index in its trajectory."""
    transition: Transition | None = None
    history: SFTRecord | None = None
    bad: BadStep | None = None
    judge: JudgeVerdict | None = None
    critique: list[SFTRecord] | None = None
    """Set (possibly empty) once the rationale stage has looked at the step."""
    invalid: tuple[tuple[str, str], ...] = ()
    """``(sample id, reason)`` of samples stored by an earlier version that this one refuses as
    records: kept out of the samples, and dropped by the export as ``record_invalid`` (where
    that version dropped them), never a failed load."""

    def samples(self) -> list[SFTRecord]:
        """The step's samples: its history sample, then its critique samples."""
        return ([self.history] if self.history is not None else []) + list(self.critique or ())

    def to_json(self, origin: Callable[[SFTRecord], dict[str, Any]]) -> dict[str, Any]:
        """The work-file form; ``origin`` gives each sample's origin (``sample_origin``)."""
        out: dict[str, Any] = {"index": self.index}
        if self.transition is not None:
            out["transition"] = self.transition.to_json()
        if self.history is not None:
            out["history"] = sample_to_json(self.history, origin(self.history))
        if self.bad is not None:
            out["bad"] = self.bad.to_json()
        if self.judge is not None:
            out["judge"] = self.judge.to_json()
        if self.critique is not None:
            out["critique"] = [sample_to_json(s, origin(s)) for s in self.critique]
        if self.invalid:
            out["invalid"] = [list(row) for row in self.invalid]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> StepUnit:
        """Inverse of ``to_json``."""
        tr, hist, bad, judge = (obj.get(k) for k in ("transition", "history", "bad", "judge"))
        crit = obj.get("critique")
        invalid = [(str(sid), str(reason)) for sid, reason in obj.get("invalid", ())]
        history = None if hist is None else _loaded(hist, invalid)
        critique = None if crit is None else [s for s in (_loaded(c, invalid) for c in crit) if s]
        return cls(
            index=obj["index"],
            transition=None if tr is None else Transition.from_json(tr),
            history=history,
            bad=None if bad is None else BadStep.from_json(bad),
            judge=None if judge is None else JudgeVerdict.from_json(judge),
            critique=critique,
            invalid=tuple(invalid),
        )


def _loaded(obj: dict[str, Any], invalid: list[tuple[str, str]]) -> SFTRecord | None:
    """A stored sample as a record, or ``None`` with its id and reason added to ``invalid``."""
    try:
        return sample_from_json(obj)
    except RecordError as e:
        invalid.append((str(obj.get("id", "")), str(e)))
        return None


UNIT_FIELDS = tuple(f.name for f in fields(StepUnit) if f.name not in ("index", "invalid"))
"""The fields the stages fill, in stage order."""


# --------------------------------------------------------------------------------------------
# Sample origin


def sample_origin(
    origin: dict[str, Any], step_index: int, kind: str, verdict: str | None
) -> dict[str, Any]:
    """A sample's provenance from its trajectory's ``origin`` (``Work.origin``): ``source``
    (``run``/``scalecua``), and for runs the benchmark, task id, episode and evaluated outcome,
    plus ``hard_case`` (the recorded critic's mistake) on the critique sample whose verdict
    contradicts what the critic said at that step."""
    if not origin:
        return {"source": "scalecua", "hard_case": None}
    hard = (origin.get("hard_cases") or {}).get(str(step_index))
    tag = hard["tag"] if hard and kind == "critique" and verdict == hard["verdict"] else None
    keys = ("source", "benchmark", "task_id", "episode", "outcome", "agent_model")
    return {**{k: origin.get(k) for k in keys}, "hard_case": tag}


def record_provenance(
    origin: dict[str, Any],
    annotator_model: str | None,
    annotator_kind: str | None,
    hashes: list[str] | tuple[str, ...],
) -> Provenance:
    """A record's ``Provenance``: the annotator behind the target and the sample's origin."""
    return Provenance(
        annotator_model=annotator_model,
        annotator_kind=annotator_kind,
        request_hashes=tuple(hashes),
        source=origin.get("source") or "scalecua",
        benchmark=origin.get("benchmark"),
        task_id=None if origin.get("task_id") is None else str(origin["task_id"]),
        hard_case=origin.get("hard_case"),
    )


# --------------------------------------------------------------------------------------------
# Samples in the work files


def messages_to_json(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """JSON form of prompt messages (images as references with marks)."""
    out = []
    for m in messages:
        parts: list[dict[str, Any]] = []
        for p in m.content:
            if isinstance(p, TextPart):
                parts.append({"text": p.text})
            else:
                ref: ImageRef = p.image
                parts.append(
                    {
                        "image": ref.path,
                        "marks": [mark_to_json(k) for k in ref.marks],
                        "size_class": ref.size_class,
                    }
                )
        out.append({"role": m.role, "content": parts})
    return out


def messages_from_json(rows: list[dict[str, Any]]) -> list[ChatMessage]:
    """Inverse of ``messages_to_json``."""
    out = []
    for row in rows:
        content: list[TextPart | ImagePart] = []
        for p in row["content"]:
            if "text" in p:
                content.append(TextPart(p["text"]))
            else:
                marks = tuple(mark_from_json(k) for k in p["marks"])
                content.append(ImagePart(ImageRef(p["image"], marks, p["size_class"])))
        out.append(ChatMessage(row["role"], content))
    return out


def sample_to_json(record: SFTRecord, origin: dict[str, Any]) -> dict[str, Any]:
    """A sample as the work files and the report hold it: the prompt as ``[system, user]``
    messages, ``labels`` (a history sample's only ``intent_masked``), the annotator
    ``provenance`` and the full ``origin`` (``sample_origin``)."""
    labels = record.labels
    prov = record.provenance
    return {
        "id": record.id,
        "kind": record.kind,
        "origin": origin,
        "platform": record.platform,
        "prompt_version": record.prompt_version,
        "trajectory_id": record.trajectory_id,
        "episode_key": record.episode_key,
        "step_index": record.step_index,
        "split": record.split,
        "messages": messages_to_json(record_messages(record)[:2]),
        "target": record.target,
        "labels": {"intent_masked": labels.intent_masked}
        if record.kind == "history"
        else {
            "verdict": labels.verdict,
            "error_dimension": labels.error_dimension,
            "intent_masked": labels.intent_masked,
            "generator": labels.generator,
        },
        "provenance": {
            "annotator_model": prov.annotator_model,
            "annotator_kind": prov.annotator_kind,
            "request_hashes": list(prov.request_hashes),
        },
    }


def sample_from_json(obj: dict[str, Any]) -> SFTRecord:
    """Inverse of ``sample_to_json``.

    Raises:
        RecordError: The sample is inconsistent.
    """
    prov = obj["provenance"]
    return record_from_messages(
        messages_from_json(obj["messages"]),
        obj["target"],
        id=obj["id"],
        kind=obj["kind"],
        platform=obj["platform"],
        prompt_version=obj["prompt_version"],
        trajectory_id=obj["trajectory_id"],
        episode_key=obj["episode_key"],
        step_index=obj["step_index"],
        split=obj["split"],
        labels=Labels(**obj["labels"]),
        provenance=record_provenance(
            obj.get("origin") or {},
            prov.get("annotator_model"),
            prov.get("annotator_kind"),
            prov.get("request_hashes", ()),
        ),
    )
