"""A critic profile: everything the model reads, in one folder.

A critic is only as good as the agreement between what it was trained on and what it is served:
the wording of its prompts, where the images stand in them, the action-space and taxonomy texts,
the first "previous summary", how tool calls are written, the pixels of each frame and the token
budget its answers need. A ``Profile`` holds all of it; data_gen, train, ``train evaluate`` and
the gateway build the critic's prompts from the same object, and a checkpoint records the digest
of the profile it was trained with.

Two profiles matter today:

- the default one, hivig's own interface (``default_profile()``, the package's
  ``critic_*_v1.txt`` templates; its prompts are the golden ones the tests pin);
- an imported one, written by ``hivig profile import-reference`` from a local copy of the HiViG
  authors' repository, for their released critic.

A profile folder::

    profile.yaml                    name, render, frame and generation settings
    critic_critique.txt             template: @@ system / @@ user / @@ images [inline] screenshot
    critic_history.txt              template: @@ images [inline] before after
    action_space_computer_use.txt   the text put in for $action_space on desktop and web
    action_space_mobile_use.txt     ... on mobile
    taxonomy.txt                    the text put in for $taxonomy
    initial_summary.txt             the previous summary of a trajectory's first step
    chat_template.jinja             the chat template the checkpoint is trained and served with

Text files are read byte for byte (no stripping): they are what the model reads.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from hivig.prompts import PromptError, PromptTemplate, load_prompt, parse_template
from hivig.vision import FramePolicy

PROFILE_YAML = "profile.yaml"
TEMPLATE_FILES = {"critic_critique": "critic_critique.txt", "critic_history": "critic_history.txt"}
ACTION_SPACE_FILES = {
    "computer_use": "action_space_computer_use.txt",
    "mobile_use": "action_space_mobile_use.txt",
}
TAXONOMY_FILE = "taxonomy.txt"
INITIAL_SUMMARY_FILE = "initial_summary.txt"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
PROFILE_FILES = (
    PROFILE_YAML,
    *TEMPLATE_FILES.values(),
    *ACTION_SPACE_FILES.values(),
    TAXONOMY_FILE,
    INITIAL_SUMMARY_FILE,
    CHAT_TEMPLATE_FILE,
)
"""Every file a profile folder must hold."""

DEFAULT_NAME = "hivig-v1"


class ProfileError(ValueError):
    """A profile folder is missing, incomplete or invalid; the message is one line."""


@dataclass(frozen=True)
class RenderPolicy:
    """How step texts are written.

    Attributes:
        tool_call_ascii: Tool-call JSON escapes non-ASCII characters (``json.dumps`` default).
        masked_calls: ``all``: a proposed step whose intent is masked (or absent) keeps all
            its tool calls; ``first``: only the first (the critique task's proposed step; an
            executed step in the history task keeps all of them either way).
        summary_feedback: ``record``: the previous summary is re-written from its two parsed
            fields; ``inner``: the model's text inside ``<summary>`` is fed back verbatim.
    """

    tool_call_ascii: bool = False
    masked_calls: str = "all"
    summary_feedback: str = "record"

    def __post_init__(self) -> None:
        _one_of("render.masked_calls", self.masked_calls, ("all", "first"))
        _one_of("render.summary_feedback", self.summary_feedback, ("record", "inner"))


@dataclass(frozen=True)
class GenerationBudget:
    """What the model's answers need: token caps and deadlines of the two calls.

    Attributes:
        history_max_tokens: New-token cap of a history update (reasoning included).
        critique_max_tokens: New-token cap of a verdict (reasoning included).
        observe_deadline_s: Time budget of a history update.
        critique_deadline_s: Time budget of a verdict.
        recurrence_note: Whether the gateway may append its recurrence note to the trajectory
            text (text a model trained without it never saw).
    """

    history_max_tokens: int = 768
    critique_max_tokens: int = 768
    observe_deadline_s: float = 8.0
    critique_deadline_s: float = 8.0
    recurrence_note: bool = True

    def __post_init__(self) -> None:
        if min(self.history_max_tokens, self.critique_max_tokens) <= 0:
            raise ProfileError("generation.*_max_tokens must be positive")
        if min(self.observe_deadline_s, self.critique_deadline_s) <= 0:
            raise ProfileError("generation.*_deadline_s must be positive")


@dataclass(frozen=True)
class Profile:
    """The whole input interface of one critic (see the module docstring).

    Attributes:
        name: A label for people (``hivig-v1``, ``hivig-reference``).
        templates: ``{"critic_critique": ..., "critic_history": ...}``.
        action_spaces: ``{"computer_use": text, "mobile_use": text}``.
        taxonomy: The text put in for ``$taxonomy``.
        initial_summary: The previous summary of every trajectory's first history update.
        chat_template: The Jinja chat template (training and serving).
        render: Step-text rules.
        frame: Frame rules.
        generation: Answer budget.
        source: Where the profile came from (free text).
    """

    name: str
    templates: dict[str, PromptTemplate]
    action_spaces: dict[str, str]
    taxonomy: str
    initial_summary: str
    chat_template: str
    render: RenderPolicy = field(default_factory=RenderPolicy)
    frame: FramePolicy = field(default_factory=FramePolicy)
    generation: GenerationBudget = field(default_factory=GenerationBudget)
    source: str = ""

    @property
    def digest(self) -> str:
        """sha256 over everything the model reads or that shapes it (not name or source)."""
        h = hashlib.sha256()
        for key, text in sorted(self._texts().items()):
            h.update(f"{key}\0{len(text.encode())}\0".encode())
            h.update(text.encode())
        settings = {k: asdict(getattr(self, k)) for k in ("render", "frame", "generation")}
        h.update(json.dumps(settings, sort_keys=True).encode())
        return h.hexdigest()

    @property
    def is_default(self) -> bool:
        """Whether this is hivig's own interface, byte for byte."""
        return self.digest == default_profile().digest

    def action_space(self, space: str) -> str:
        """The text put in for ``$action_space`` in a prompt for ``space``.

        Args:
            space: ``computer_use`` or ``mobile_use``.

        Returns:
            The profile's action-space text.
        """
        return self.action_spaces[space]

    def _texts(self) -> dict[str, str]:
        out = {f"template:{n}": template_file_text(t) for n, t in self.templates.items()}
        out |= {f"space:{n}": t for n, t in self.action_spaces.items()}
        out |= {
            "taxonomy": self.taxonomy,
            "initial_summary": self.initial_summary,
            "chat_template": self.chat_template,
        }
        return out

    def write(self, folder: str | Path) -> Path:
        """Write the profile as a folder (``load_profile`` reads it back to an equal digest).

        Args:
            folder: Where to write (created; files of the same names are replaced).

        Returns:
            The folder.
        """
        root = Path(folder)
        root.mkdir(parents=True, exist_ok=True)
        for name, file in TEMPLATE_FILES.items():
            _write(root / file, template_file_text(self.templates[name]))
        for space, file in ACTION_SPACE_FILES.items():
            _write(root / file, self.action_spaces[space])
        _write(root / TAXONOMY_FILE, self.taxonomy)
        _write(root / INITIAL_SUMMARY_FILE, self.initial_summary)
        _write(root / CHAT_TEMPLATE_FILE, self.chat_template)
        _write(root / PROFILE_YAML, self._yaml())
        return root

    def _yaml(self) -> str:
        import yaml

        body = {"name": self.name, "source": self.source}
        body |= {k: asdict(getattr(self, k)) for k in ("render", "frame", "generation")}
        return yaml.safe_dump(body, sort_keys=False, allow_unicode=True)


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ProfileError(f"{key} must be one of {', '.join(allowed)}, got {value!r}")


def _write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8"))


def template_file_text(t: PromptTemplate) -> str:
    """A template as its profile file holds it (``@@ system`` / ``@@ user`` / ``@@ images``).

    Args:
        t: The template.

    Returns:
        The file's text; ``_parse`` reads it back to an equal template.
    """
    images = ""
    if t.image_slots:
        inline = " inline" if t.inline_images else ""
        images = f"@@ images{inline} {' '.join(t.image_slots)}\n"
    return f"@@ system\n{t.system}\n@@ user\n{images}{t.user}\n"


@cache
def default_profile() -> Profile:
    """The default profile: the package templates and texts the golden prompt hashes pin.

    Returns:
        hivig's own profile (``hivig-v1``), built from the package's files.
    """
    # Imported here: hivig.prompts imports this package's public names.
    from hivig.actions import action_space
    from hivig.contracts import INITIAL_HISTORY
    from hivig.prompts import taxonomy_text

    spaces = {
        space: json.dumps(action_space(space), ensure_ascii=False) for space in ACTION_SPACE_FILES
    }
    chat = resources.files("hivig.prompts").joinpath("chat_template_v1.jinja").read_text("utf-8")
    return Profile(
        name=DEFAULT_NAME,
        templates={name: load_prompt(name) for name in TEMPLATE_FILES},
        action_spaces=spaces,
        taxonomy=taxonomy_text(brief=True),
        initial_summary=INITIAL_HISTORY.summary,
        chat_template=chat,
        source="the hivig package",
    )


def _read_text(root: Path, file: str) -> str:
    try:
        return (root / file).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProfileError(f"{root / file}: not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise ProfileError(f"{root / file}: cannot be read ({e.strerror})") from None


def _settings(root: Path) -> dict[str, Any]:
    import yaml

    try:
        body = yaml.safe_load(_read_text(root, PROFILE_YAML))
    except yaml.YAMLError as e:
        line = str(e).splitlines()[0]
        raise ProfileError(f"{root / PROFILE_YAML}: not valid YAML ({line})") from None
    if not isinstance(body, dict):
        raise ProfileError(f"{root / PROFILE_YAML}: must be a mapping of settings")
    known = {"name", "source", "render", "frame", "generation", "marker_geometry"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise ProfileError(f"{root / PROFILE_YAML}: unknown keys {unknown}; known: {sorted(known)}")
    return body


def _section(root: Path, body: dict[str, Any], key: str, cls: type) -> Any:
    value = body.get(key) or {}
    if not isinstance(value, dict):
        raise ProfileError(f"{root / PROFILE_YAML}: `{key}` must be a mapping")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - names)
    if unknown:
        raise ProfileError(f"{root / PROFILE_YAML}: unknown `{key}` keys {unknown}")
    try:
        return cls(**value)
    except (TypeError, ValueError) as e:
        raise ProfileError(f"{root / PROFILE_YAML}: {e}") from None


def _template(root: Path, name: str) -> PromptTemplate:
    file = TEMPLATE_FILES[name]
    try:
        template = parse_template(name, 1, _read_text(root, file))
    except PromptError as e:
        raise ProfileError(f"{root / file}: {e}") from None
    documented = load_prompt(name)
    if set(template.placeholders) != set(documented.placeholders) or set(
        template.image_slots
    ) != set(documented.image_slots):
        raise ProfileError(
            f"{root / file}: placeholders {sorted(template.placeholders)} differ from the "
            f"documented ones {sorted(documented.placeholders)}"
        )
    return template


def load_profile(folder: str | Path) -> Profile:
    """Read a profile folder (see the module docstring).

    Args:
        folder: The folder ``Profile.write`` or ``hivig profile import-reference`` wrote.

    Returns:
        The profile.

    Raises:
        ProfileError: The folder is missing, lacks a file, or a file is invalid (one line).
    """
    root = Path(folder)
    if not root.is_dir():
        raise ProfileError(f"profile folder not found: {root}")
    missing = [f for f in PROFILE_FILES if not (root / f).is_file()]
    if missing:
        raise ProfileError(f"profile folder {root} lacks {', '.join(missing)}")
    body = _settings(root)
    try:
        return Profile(
            name=str(body.get("name") or root.name),
            templates={name: _template(root, name) for name in TEMPLATE_FILES},
            action_spaces={s: _read_text(root, f) for s, f in ACTION_SPACE_FILES.items()},
            taxonomy=_read_text(root, TAXONOMY_FILE),
            initial_summary=_read_text(root, INITIAL_SUMMARY_FILE),
            chat_template=_read_text(root, CHAT_TEMPLATE_FILE),
            render=_section(root, body, "render", RenderPolicy),
            frame=_section(root, body, "frame", FramePolicy),
            generation=_section(root, body, "generation", GenerationBudget),
            source=str(body.get("source") or ""),
        )
    except ProfileError as e:
        message = str(e)
        raise ProfileError(
            message if str(root) in message else f"{root / PROFILE_YAML}: {message}"
        ) from None


def resolve_profile(folder: str | Path | None) -> Profile:
    """``load_profile(folder)``, or the default profile for ``None`` or an empty string.

    Args:
        folder: A profile folder, or nothing.

    Returns:
        The profile.
    """
    return load_profile(folder) if folder else default_profile()


CHECKPOINT_PROFILE_DIR = "profile"
"""Sub-folder of a checkpoint written by ``train`` holding the profile it was trained with."""


def checkpoint_profile(checkpoint: str | Path) -> Profile | None:
    """The profile a checkpoint records (``train`` writes it).

    ``None`` when it records none (a checkpoint from elsewhere, such as a released one).

    Args:
        checkpoint: A checkpoint folder.

    Returns:
        The recorded profile, or ``None``.

    Raises:
        ProfileError: The recorded profile is incomplete or invalid.
    """
    folder = Path(checkpoint) / CHECKPOINT_PROFILE_DIR
    return load_profile(folder) if folder.is_dir() else None


def check_served_profile(checkpoint: str | Path, served: Profile) -> None:
    """Refuse to serve a checkpoint with a profile other than the one it was trained with.

    A critic reads only the interface it learnt: another wording, image position or frame
    gives answers nobody measured. A checkpoint that records no profile is not checked.

    Args:
        checkpoint: The checkpoint folder served.
        served: The profile it is served with.

    Raises:
        ProfileError: One line naming both profiles and the two ways forward.
    """
    trained = checkpoint_profile(checkpoint)
    if trained is None or trained.digest == served.digest:
        return
    raise ProfileError(
        f"{checkpoint} was trained with profile {trained.name} ({trained.digest[:12]}) but is "
        f"served with {served.name} ({served.digest[:12]}): serve it with "
        f"critic.profile={Path(checkpoint) / CHECKPOINT_PROFILE_DIR}, or set "
        "critic.allow_profile_mismatch=true to do so on purpose"
    )
