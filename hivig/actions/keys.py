"""Key names: the pyautogui keyboard vocabulary used to validate ``press``/``hotkey`` arguments.

ScaleCUA and OSWorld actions name keys the way pyautogui does (``enter``, ``ctrl``, ``pagedown``).
Prose occasionally ends up inside ``press(keys=...)``; checking every name against this list is
how such steps are caught and quarantined instead of being rendered as a nonsense hotkey.
"""

from __future__ import annotations

import re
import string

_NAMED_KEYS = [
    "accept",
    "add",
    "alt",
    "altleft",
    "altright",
    "apps",
    "backspace",
    "browserback",
    "browserfavorites",
    "browserforward",
    "browserhome",
    "browserrefresh",
    "browsersearch",
    "browserstop",
    "capslock",
    "clear",
    "convert",
    "ctrl",
    "ctrlleft",
    "ctrlright",
    "decimal",
    "del",
    "delete",
    "divide",
    "down",
    "end",
    "enter",
    "esc",
    "escape",
    "execute",
    "final",
    "fn",
    "hanguel",
    "hangul",
    "hanja",
    "help",
    "home",
    "insert",
    "junja",
    "kana",
    "kanji",
    "launchapp1",
    "launchapp2",
    "launchmail",
    "launchmediaselect",
    "left",
    "modechange",
    "multiply",
    "nexttrack",
    "nonconvert",
    "numlock",
    "pagedown",
    "pageup",
    "pause",
    "pgdn",
    "pgup",
    "playpause",
    "prevtrack",
    "print",
    "printscreen",
    "prntscrn",
    "prtsc",
    "prtscr",
    "return",
    "right",
    "scrolllock",
    "select",
    "separator",
    "shift",
    "shiftleft",
    "shiftright",
    "sleep",
    "space",
    "stop",
    "subtract",
    "tab",
    "up",
    "volumedown",
    "volumemute",
    "volumeup",
    "win",
    "winleft",
    "winright",
    "yen",
    "command",
    "option",
    "optionleft",
    "optionright",
]

# Names that are not in pyautogui's table but appear in agent data for the same physical keys
# (macOS and Linux spellings of the command/super key, spelled-out modifiers).
_EXTRA_NAMES = ["cmd", "super", "meta", "control", "backtab"]

PYAUTOGUI_KEYS: frozenset[str] = frozenset(
    _NAMED_KEYS
    + _EXTRA_NAMES
    + [f"f{i}" for i in range(1, 25)]
    + [f"num{i}" for i in range(10)]
    + list(string.ascii_lowercase)
    + list(string.digits)
    + list(string.punctuation)
    + ["\t", "\n", "\r", " "]
)
"""Lower-case key names accepted on desktop and web (pyautogui names plus common aliases)."""

PYAUTOGUI_KEY_TABLE: frozenset[str] = PYAUTOGUI_KEYS - frozenset(_EXTRA_NAMES)
"""pyautogui's own key table, case-sensitive and without aliases: the names an executor that
checks keys against it (WebArenaLiteV2's browser environment) presses; it skips any other."""

# Android key names are adb keyevent names (``volume_up``, ``enter``): short snake_case words.
_MOBILE_KEY_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")


def is_key_name(name: object) -> bool:
    """Whether ``name`` is a known desktop key name (case-insensitive; any single character).

    Args:
        name: Candidate key name.

    Returns:
        True for a pyautogui key name, an accepted alias, or a single character.
    """
    if not isinstance(name, str) or not name:
        return False
    return len(name) == 1 or name.lower() in PYAUTOGUI_KEYS


def is_mobile_key_name(name: object) -> bool:
    """Whether ``name`` looks like an Android key name (a desktop name or a snake_case word).

    Args:
        name: Candidate key name.

    Returns:
        True when the name is a known key or a short lower-case identifier.
    """
    if is_key_name(name):
        return True
    return isinstance(name, str) and _MOBILE_KEY_RE.fullmatch(name) is not None
