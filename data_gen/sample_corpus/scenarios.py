"""Coherent multi-step tasks on synthetic screens, one function per scenario.

Every scenario renders the screen before each step, picks the action that a careful human would
take on *that* screen (coordinates inside the target element), and renders the next screen with
the effect of the action (a menu opens, a dialog appears, a field fills, a list scrolls). Each step
records which element every call aims at, so tests can check that ingested coordinates land
inside the right box.

The scenarios live in ``desktop``, ``web`` and ``android``; this module maps each platform to
the scenarios it rotates through.
"""

from __future__ import annotations

from collections.abc import Callable

from data_gen.sample_corpus._base import Ctx, Episode, StepSpec
from data_gen.sample_corpus.android import delete_alarm, find_contact, install_app, set_alarm
from data_gen.sample_corpus.desktop import (
    copy_text,
    delete_file,
    drag_file,
    export_pdf,
    open_file,
    save_as,
)
from data_gen.sample_corpus.web import web_form, web_report, web_search, web_ticket

__all__ = ["SCENARIOS", "Ctx", "Episode", "Scenario", "StepSpec"]

Scenario = Callable[[Ctx], Episode]

SCENARIOS: dict[str, tuple[Scenario, ...]] = {
    "windows": (save_as, open_file, drag_file, copy_text, delete_file, export_pdf),
    "mac": (save_as, open_file, drag_file, copy_text, delete_file, export_pdf),
    "ubuntu": (save_as, open_file, drag_file, copy_text, delete_file, export_pdf),
    "web": (web_search, web_form, web_report, web_ticket),
    "android": (set_alarm, find_contact, delete_alarm, install_app),
}
