"""What a perturbation generator sees (``StepView``) and what it returns (``BadStep``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from data_gen.perturb.calls import Call
from data_gen.perturb.elements import Element

GeneratorFamily = Literal["programmatic", "annotator", "run"]


@dataclass(frozen=True)
class StepView:
    """The ground truth of one step, as plain data (serialisable into an annotator oracle).

    Attributes:
        sample_id: Id of the step's critique sample pair (seeds derive from it).
        platform: ``windows``, ``mac``, ``ubuntu``, ``web`` or ``android``.
        space: ``computer_use`` or ``mobile_use``.
        task: The user instruction.
        intent: The expert's verbal intent (``Action:`` line), possibly empty.
        calls: The expert's tool calls as argument dicts.
        is_final: Whether this is the trajectory's last step.
        next_intent: The following step's intent (empty at the end).
        next_calls: The following step's calls (empty at the end).
        answered_before: Whether an earlier step gave an ``answer``.
        elements: Elements on the current screen.
        earlier_elements: Elements of earlier screens, oldest first.
        next_elements: Elements of the next screen (after this step executed).
        earlier_intents: Intents of the earlier steps, oldest first (aligned with
            ``earlier_elements``); generators reuse this real wording instead of templates.
        earlier_calls: Calls of the earlier steps, oldest first.
        final_intent: Intent of the trajectory's last step when it ends the episode, else empty.
        habit_boxes: Boxes that an element labelled like the expert's target has on other
            screens of the corpus (where the control usually sits). Kept for the oracle's
            form only: no generator uses them, since a position taken from another platform's
            screens says nothing about this one.
        habit_ghosts: ``(label, role, x1, y1, x2, y2)`` of targets that similar screens of the
            same corpus show and this one does not, with the box they have there (Visual
            Hallucination's layout-habit ghosts; ``ElementIndex.habit_ghosts``).
        habit_steps: ``(label, intent, calls JSON)`` of expert steps of similar screens in
            other episodes that click an element this screen does not show (the other
            layout-habit ghosts; ``ElementIndex.habit_steps``).
        screenshot: The step's screenshot path (groups repeated steps of instruction variants).
        partial_screens: Whether the current or an earlier screen's element list is incomplete
            (annotator-grounded targets only), so absence from a screen cannot be verified.
    """

    sample_id: str
    platform: str
    space: str
    task: str
    intent: str
    calls: tuple[Call, ...]
    is_final: bool
    next_intent: str = ""
    next_calls: tuple[Call, ...] = ()
    answered_before: bool = False
    elements: tuple[Element, ...] = ()
    earlier_elements: tuple[tuple[Element, ...], ...] = ()
    next_elements: tuple[Element, ...] = ()
    earlier_intents: tuple[str, ...] = ()
    earlier_calls: tuple[tuple[Call, ...], ...] = ()
    final_intent: str = ""
    partial_screens: bool = False
    screenshot: str = ""
    habit_boxes: tuple[tuple[int, int, int, int], ...] = ()
    habit_ghosts: tuple[tuple[str, str, int, int, int, int], ...] = ()
    habit_steps: tuple[tuple[str, str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON form (the annotator oracle)."""
        out = asdict(self)
        out["calls"] = list(self.calls)
        out["next_calls"] = list(self.next_calls)
        out["elements"] = [e.to_json() for e in self.elements]
        out["earlier_elements"] = [[e.to_json() for e in s] for s in self.earlier_elements]
        out["next_elements"] = [e.to_json() for e in self.next_elements]
        out["earlier_intents"] = list(self.earlier_intents)
        out["earlier_calls"] = [list(c) for c in self.earlier_calls]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> StepView:
        """Inverse of ``to_json``."""

        def els(rows: list[dict[str, Any]]) -> tuple[Element, ...]:
            return tuple(
                Element(r["label"], r["role"], tuple(r["box"]), r.get("text"))  # type: ignore[arg-type]
                for r in rows
            )

        return cls(
            sample_id=obj["sample_id"],
            platform=obj["platform"],
            space=obj["space"],
            task=obj["task"],
            intent=obj["intent"],
            calls=tuple(obj["calls"]),
            is_final=obj["is_final"],
            next_intent=obj.get("next_intent", ""),
            next_calls=tuple(obj.get("next_calls", ())),
            answered_before=obj.get("answered_before", False),
            elements=els(obj.get("elements", [])),
            earlier_elements=tuple(els(s) for s in obj.get("earlier_elements", [])),
            next_elements=els(obj.get("next_elements", [])),
            earlier_intents=tuple(obj.get("earlier_intents", ())),
            earlier_calls=tuple(tuple(c) for c in obj.get("earlier_calls", ())),
            final_intent=obj.get("final_intent", ""),
            partial_screens=obj.get("partial_screens", False),
            screenshot=obj.get("screenshot", ""),
            habit_boxes=tuple(tuple(b) for b in obj.get("habit_boxes", ())),  # type: ignore[misc]
            habit_ghosts=tuple(tuple(g) for g in obj.get("habit_ghosts", ())),  # type: ignore[misc]
            habit_steps=tuple(tuple(g) for g in obj.get("habit_steps", ())),  # type: ignore[misc]
        )


@dataclass(frozen=True)
class BadStep:
    """A perturbed step.

    Attributes:
        dimension: Exact taxonomy name of the injected error.
        method: Generator variant (``scroll_sign_flip``, ``near_miss`` ...), for the report.
        generator: ``programmatic`` or ``annotator``.
        intent: The ``Action:`` line of the Bad step.
        text: The Bad step's tool-call text exactly as the critic sees it (may be invalid).
        calls: Argument dicts when ``text`` parses, else ``None``.
        thought: The rejected thought (annotator generator only).
        note: What was changed, in words, for the rationale oracle and the report.
    """

    dimension: str
    method: str
    generator: GeneratorFamily
    intent: str
    text: str
    calls: tuple[Call, ...] | None
    thought: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        out = asdict(self)
        out["calls"] = None if self.calls is None else list(self.calls)
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> BadStep:
        """Inverse of ``to_json``."""
        calls = obj.get("calls")
        return cls(
            dimension=obj["dimension"],
            method=obj["method"],
            generator=obj["generator"],
            intent=obj["intent"],
            text=obj["text"],
            calls=None if calls is None else tuple(calls),
            thought=obj.get("thought", ""),
            note=obj.get("note", ""),
            extra=obj.get("extra", {}),
        )
