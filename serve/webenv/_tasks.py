"""Tasks for the test application: an instruction, a start page and a success check."""

from __future__ import annotations

from dataclasses import dataclass

from serve.webenv._app import PAGES


@dataclass(frozen=True)
class WebTask:
    """One episode's goal.

    Attributes:
        instruction: What the agent is asked to do (the observation's ``instruction``).
        start: Page the episode starts on (one of ``PAGES``).
        success_js: JavaScript expression over ``s`` (the application state, see
            ``window.hivigState()`` in ``static/app.js``) that is true once the task is done;
            ``None`` for tasks judged only by ``answer``.
        answer: Text that an ``answer`` action must contain (case-insensitive) to succeed.
        max_steps: The episode ends (``done``) after this many steps.
        name: Short identifier for logs and the built-in ``TASKS`` table.
    """

    instruction: str
    start: str = "index.html"
    success_js: str | None = None
    answer: str | None = None
    max_steps: int = 15
    name: str = "custom"

    def __post_init__(self) -> None:
        if self.start not in PAGES:
            raise ValueError(f"start must be one of {list(PAGES)}, got {self.start!r}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")


TASKS: dict[str, WebTask] = {
    t.name: t
    for t in (
        WebTask(
            name="add_contact",
            instruction="Open the form, add a contact named Ada Lovelace and save it.",
            success_js="!!s.form && s.form.name === 'Ada Lovelace'",
        ),
        WebTask(
            name="select_invoice",
            instruction="Go to Items and select the invoice for Fabrikam.",
            success_js="s.selected === 'item-3'",
        ),
        WebTask(
            name="dark_mode",
            instruction="Turn on dark mode in the settings.",
            success_js="s.dark === true",
        ),
        WebTask(
            name="q3_revenue",
            instruction="What was the Q3 revenue in the report? Answer with the amount.",
            start="reports.html",
            answer="$4.2M",
        ),
        # Cannot succeed: the button is disabled. Agents that keep clicking it are the
        # recurrence case the detector and R3 exist for.
        WebTask(
            name="publish",
            instruction="Publish the dashboard.",
            success_js="s.published === true",
        ),
    )
}
"""Built-in tasks by name (``BrowserEnv.reset("add_contact")``)."""
