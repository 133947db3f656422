"""Element boxes for corpora without a sidecar: ask the annotator for each click's target.

Real ScaleCUA data has no ``elements.jsonl``, so the element-based generators had nothing to work
with. For every step with a point action on a screenshot the sidecar does not cover, the annotator
gets the screenshot and the expert step (prompt ``annotator_grounding``) and returns the target's
label, role and box on the 0-1000 grid. An answer counts only when the expert's own click lies
inside the returned box; otherwise it is dropped with a reason, never guessed.

A grounded screen knows one element (the target), not the whole screen, so it is marked
``partial``: generators that must know what is *absent* from a screen (Visual Hallucination)
skip partial screens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from data_gen.annotator import Annotator, AnnotatorRequest, Rejected
from data_gen.perturb.calls import primary_point
from data_gen.perturb.elements import Element, ElementIndex, target_at
from hivig.actions import space_for_platform
from hivig.contracts import ContractError, parse_grounding
from hivig.messages import ImageRef
from hivig.prompts import build_grounding_messages, format_step
from hivig.trajectory import Trajectory
from hivig.vision import size_class_for_platform

STAGE = "grounding"
"""Annotator stage name of grounding requests (also the offline writer's key)."""


def grounding_validator(point: tuple[int, int]) -> Callable[[str, str | None], Element | Rejected]:
    """Validator of a grounding answer: one JSON element whose box contains ``point``."""

    def validate(text: str, reasoning: str | None) -> Element | Rejected:
        parsed = parse_grounding(text, reasoning)
        if isinstance(parsed, ContractError):
            return Rejected("grounding_unparseable", f"{parsed.message}: {text[:200]!r}")
        element = Element(parsed.label, parsed.role, parsed.box)
        if not element.contains(*point):
            return Rejected(
                "grounding_click_outside_box", f"click {list(point)} not in {list(element.box)}"
            )
        return element

    return validate


def grounding_jobs(trajectories: list[Trajectory], index: ElementIndex) -> list[tuple[Any, ...]]:
    """``(trajectory, step index, point)`` of every point step on a screen the index lacks."""
    jobs = []
    for traj in trajectories:
        for k, step in enumerate(traj.steps):
            if index.get(step.screenshot):
                continue
            hit = primary_point([a.to_arguments() for a in step.actions])
            if hit is not None:
                jobs.append((traj, k, tuple(hit[1]["coordinate"])))
    return jobs


def ground_corpus(
    trajectories: list[Trajectory],
    index: ElementIndex,
    annotator: Annotator,
    run_all: Callable[[list[Coroutine[Any, Any, Any]]], None],
    sidecar: ElementIndex | None = None,
) -> Counter[str]:
    """Add the annotator-grounded target of every uncovered point step to ``index``.

    Args:
        trajectories: The corpus.
        index: Element index to extend (screens it already covers are left alone).
        annotator: The annotator (the offline one answers from ``sidecar``).
        run_all: Runs the request coroutines (the stages' bounded event loop).
        sidecar: Ground truth for the offline annotator's oracle, when there is one.

    Returns:
        Counters: ``grounded`` and ``dropped_<reason>`` per request.
    """
    counts: Counter[str] = Counter()
    found: dict[str, list[Element]] = {}

    async def one(traj: Trajectory, k: int, point: tuple[int, int]) -> None:
        step = traj.steps[k]
        screen = ImageRef(step.screenshot, (), size_class_for_platform(traj.platform))
        text = format_step(step.intent, step.actions, space_for_platform(traj.platform))
        messages = build_grounding_messages(traj.task, traj.platform, screen, text)
        truth = target_at(sidecar.get(step.screenshot), *point) if sidecar else None
        oracle = {"element": None if truth is None else truth.to_json()}
        request = AnnotatorRequest(STAGE, list(messages), oracle)
        result = await annotator.annotate(request, grounding_validator(point))
        if result.value is None:
            counts[f"dropped_{result.reason}"] += 1
            return
        counts["grounded"] += 1
        found.setdefault(step.screenshot, []).append(result.value)

    run_all([one(*job) for job in grounding_jobs(trajectories, index)])
    for shot, elements in sorted(found.items()):
        index.by_path[shot] = tuple(sorted(set(elements), key=lambda e: (e.box, e.label)))
        index.partial.add(shot)
    return counts
