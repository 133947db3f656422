"""Versioned prompt templates: ``hivig/prompts/<name>_v<N>.txt``, loaded by name.

A template file has a system section and a user section::

    @@ system
    You are ... $action_space ...
    @@ user
    @@ images before after
    User Instruction (Goal): $task
    ...

Placeholders use ``string.Template`` syntax (``$name`` or ``${name}``, ``$$`` for a literal dollar).
The optional ``@@ images`` line names the image slots; their ``ImageRef`` values go first in the
user message, in that order, so every message starts with its most reusable parts (system prompt,
then screenshots, then per-step text) and serving engines can reuse prefix caches. A profile for
a checkpoint trained with images inside the text writes ``@@ images inline before after``
instead: each slot then stands once in the user text as ``$before`` / ``$after``, and the image
goes exactly there. Rendering fails
loudly on a missing or an unused value: a silently empty field in a training prompt is a data bug.

A released version is never edited; a change adds ``<name>_v<N+1>.txt``.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from hivig.messages import ChatMessage, ImagePart, ImageRef, TextPart

_FILE = re.compile(r"^(?P<name>[a-z][a-z0-9_]*)_v(?P<version>[1-9][0-9]*)\.txt$")
_SYSTEM = "@@ system"
_USER = "@@ user"
_IMAGES = "@@ images"
_INLINE = "inline"


class PromptError(ValueError):
    """A prompt cannot be found, parsed or rendered (unknown name, missing or unused value)."""


def _identifiers(template: string.Template) -> list[str]:
    # ``Template.get_identifiers`` is 3.11+; the pattern walk works on 3.10 too and also rejects
    # malformed placeholders (a lone ``$`` followed by a non-identifier).
    names: list[str] = []
    for match in template.pattern.finditer(template.template):
        if match.group("invalid") is not None:
            raise PromptError(f"malformed placeholder at offset {match.start('invalid')}")
        name = match.group("named") or match.group("braced")
        if name and name not in names:
            names.append(name)
    return names


@dataclass(frozen=True)
class PromptTemplate:
    """One version of one prompt.

    Attributes:
        name: Prompt name, e.g. ``critic_critique``.
        version: Version number (the ``N`` of ``_vN``).
        system: Raw system section.
        user: Raw user section (text only).
        image_slots: Names of the image values, in the order they open the user message.
        inline_images: The image slots stand in the user text (``$screenshot``) and the images
            go where they stand, instead of opening the message.
    """

    name: str
    version: int
    system: str
    user: str
    image_slots: tuple[str, ...] = ()
    inline_images: bool = False

    @property
    def id(self) -> str:
        """Stable identifier recorded with every sample, e.g. ``critic_critique_v1``."""
        return f"{self.name}_v{self.version}"

    @property
    def placeholders(self) -> tuple[str, ...]:
        """Every value ``render`` needs: text placeholders, then image slots."""
        text = _identifiers(string.Template(self.system)) + _identifiers(string.Template(self.user))
        ordered = list(dict.fromkeys(text))
        return tuple(ordered + [s for s in self.image_slots if s not in ordered])

    def render(self, **values: str | ImageRef) -> list[ChatMessage]:
        """Fill the template: a system message, then a user message (images first, then text).

        Args:
            **values: One ``str`` per text placeholder and one ``ImageRef`` per image slot.

        Returns:
            ``[system, user]`` chat messages.

        Raises:
            PromptError: A value is missing, unused, or of the wrong kind for its slot.
        """
        needed = set(self.placeholders)
        missing = sorted(needed - values.keys())
        unused = sorted(values.keys() - needed)
        if missing or unused:
            raise PromptError(f"{self.id}: missing values {missing}, unused values {unused}")
        for slot in self.image_slots:
            if not isinstance(values[slot], ImageRef):
                raise PromptError(f"{self.id}: image slot {slot!r} needs an ImageRef")
        texts = {k: v for k, v in values.items() if k not in self.image_slots}
        for key, value in texts.items():
            if not isinstance(value, str):
                raise PromptError(f"{self.id}: value {key!r} must be a str, got {type(value)}")
        system = string.Template(self.system).substitute(texts)
        if self.inline_images:
            return [ChatMessage("system", [TextPart(system)]), self._inline_user(texts, values)]
        user = string.Template(self.user).substitute(texts)
        images: list[TextPart | ImagePart] = [ImagePart(values[s]) for s in self.image_slots]
        return [
            ChatMessage("system", [TextPart(system)]),
            ChatMessage("user", [*images, TextPart(user)]),
        ]

    def _inline_user(self, texts: dict[str, str], values: dict[str, str | ImageRef]) -> ChatMessage:
        # Each slot is cut out of the template text before substitution, so a value that happens
        # to contain "$before" (a task quoting a prompt) can never turn into an image.
        content: list[TextPart | ImagePart] = []
        for piece in _split_slots(self.user, self.image_slots):
            if isinstance(piece, str):
                text = string.Template(piece).substitute(texts)
                if text:
                    content.append(TextPart(text))
            else:
                content.append(ImagePart(values[piece[0]]))
        return ChatMessage("user", content)


def _slot_pattern(slots: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(s) for s in slots)
    # ``$$`` is matched as a unit so that a literal dollar is never the start of a slot.
    return re.compile(rf"\$\$|\$(?:(?P<a>{names})(?![A-Za-z0-9_])|\{{(?P<b>{names})\}})")


def _split_slots(text: str, slots: tuple[str, ...]) -> list[str | tuple[str]]:
    """``text`` cut at each image slot: text pieces, and ``(slot,)`` where an image stands."""
    out: list[str | tuple[str]] = []
    pos = 0
    for match in _slot_pattern(slots).finditer(text):
        name = match.group("a") or match.group("b")
        if name is None:
            continue  # a literal ``$$``
        out += [text[pos : match.start()], (name,)]
        pos = match.end()
    out.append(text[pos:])
    return out


def parse_template(name: str, version: int, text: str) -> PromptTemplate:
    """A template from the text of a template file (``@@ system``, ``@@ user``, image slots).

    Args:
        name: The prompt's name (``critic_critique``), for messages and the template's id.
        version: Its version number.
        text: The file's text.

    Returns:
        The template, its placeholders and image slots checked.

    Raises:
        PromptError: A section is missing, a placeholder is malformed, or an inline image slot
            does not stand exactly once in the user text.
    """
    lines = text.split("\n")
    if not lines or lines[0].strip() != _SYSTEM:
        raise PromptError(f"{name}_v{version}: the file must start with {_SYSTEM!r}")
    try:
        user_at = next(i for i, line in enumerate(lines) if line.strip() == _USER)
    except StopIteration:
        raise PromptError(f"{name}_v{version}: no {_USER!r} section") from None
    system = "\n".join(lines[1:user_at]).strip("\n")
    user_lines = lines[user_at + 1 :]
    slots: tuple[str, ...] = ()
    inline = False
    if user_lines and user_lines[0].startswith(_IMAGES):
        slots = tuple(user_lines[0][len(_IMAGES) :].split())
        inline = bool(slots) and slots[0] == _INLINE
        slots = slots[1:] if inline else slots
        user_lines = user_lines[1:]
    user = "\n".join(user_lines).strip("\n")
    template = PromptTemplate(name, version, system, user, slots, inline)
    _identifiers(string.Template(system))
    _identifiers(string.Template(user))
    if inline:
        _check_inline(template)
    return template


def _check_inline(template: PromptTemplate) -> None:
    if not template.image_slots:
        raise PromptError(f"{template.id}: `{_IMAGES} {_INLINE}` names no image slot")
    if set(_identifiers(string.Template(template.system))) & set(template.image_slots):
        raise PromptError(f"{template.id}: an image slot cannot stand in the system text")
    cut = [p[0] for p in _split_slots(template.user, template.image_slots) if isinstance(p, tuple)]
    for slot in template.image_slots:
        if cut.count(slot) != 1:
            raise PromptError(
                f"{template.id}: inline image slot ${slot} must stand exactly once in the user "
                f"text (found {cut.count(slot)})"
            )


@cache
def available_prompts() -> dict[str, tuple[int, ...]]:
    """Prompt names shipped with the package and their versions, ascending.

    Returns:
        ``{name: (version, ...)}`` for every ``<name>_v<N>.txt`` in the package, names sorted.
    """
    found: dict[str, list[int]] = {}
    for entry in resources.files("hivig.prompts").iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.setdefault(match["name"], []).append(int(match["version"]))
    return {name: tuple(sorted(versions)) for name, versions in sorted(found.items())}


@cache
def load_prompt(name: str, version: int | None = None) -> PromptTemplate:
    """Load a prompt template by name.

    Args:
        name: Prompt name without version, e.g. ``critic_history``.
        version: Version to load; the latest shipped one by default.

    Returns:
        The parsed template.

    Raises:
        PromptError: Unknown name or version, or a malformed file.
    """
    versions = available_prompts().get(name)
    if not versions:
        raise PromptError(f"unknown prompt {name!r}; known: {sorted(available_prompts())}")
    chosen = versions[-1] if version is None else version
    if chosen not in versions:
        raise PromptError(f"prompt {name!r} has no version {version}; shipped: {list(versions)}")
    text = resources.files("hivig.prompts").joinpath(f"{name}_v{chosen}.txt").read_text("utf-8")
    return parse_template(name, chosen, text)


def load_prompt_dir(directory: str | Path, names: tuple[str, ...]) -> dict[str, PromptTemplate]:
    """Load the latest ``<name>_v<N>.txt`` of each of ``names`` from a directory (a prompt profile).

    A profile lets a checkpoint trained on another prompt layout be served with its own wording.
    Each template must use exactly the placeholders and image slots of the shipped template of the
    same name, so every builder fills it with the same documented values.

    Args:
        directory: Folder holding the template files.
        names: Prompt names the profile must provide, e.g. ``CRITIC_PROMPTS``.

    Returns:
        ``{name: template}``.

    Raises:
        PromptError: The folder is missing, a name has no file, a file is malformed, or its
            placeholders differ from the shipped template's.
    """
    root = Path(directory)
    if not root.is_dir():
        raise PromptError(f"prompt profile folder not found: {root}")
    found: dict[str, list[int]] = {}
    for entry in root.iterdir():
        match = _FILE.match(entry.name)
        if match and match["name"] in names:
            found.setdefault(match["name"], []).append(int(match["version"]))
    out: dict[str, PromptTemplate] = {}
    for name in names:
        if name not in found:
            raise PromptError(f"prompt profile {root} has no {name}_v<N>.txt")
        version = max(found[name])
        template = parse_template(
            name, version, (root / f"{name}_v{version}.txt").read_text("utf-8")
        )
        shipped = load_prompt(name)
        if set(template.placeholders) != set(shipped.placeholders) or (
            template.image_slots != shipped.image_slots
        ):
            raise PromptError(
                f"{root / f'{name}_v{version}.txt'}: placeholders {sorted(template.placeholders)}"
                f" differ from the documented ones {sorted(shipped.placeholders)}"
            )
        out[name] = template
    return out
