"""Import the HiViG authors' critic interface from a local copy of their repository.

The authors released a critic (Qwen3-VL-8B-Thinking trained with LlamaFactory's ``qwen3_vl``
template) together with the scripts that wrote its training data. Serving that checkpoint well
means showing it exactly the prompts it was trained on. hivig ships none of their text: this
module reads a user's copy of the repository at run time and writes a profile folder (see
``hivig.profiles._profile``) that reproduces their interface byte for byte.

The scripts are never executed or imported. They are parsed with ``ast``, and only a small,
closed set of expressions is evaluated: string constants, ``.strip()``, ``"sep".join`` over a
list comprehension of f-strings, lists, dicts and integer arithmetic. Everything else is refused.

Which facts come from where (revision fd1d4a2):

- critique template, action spaces and taxonomy: the critique SFT converter's module constants;
- history template: the summary SFT converter's constants (its action spaces must equal the
  critique's);
- the opening "previous summary": the first ``rolling_summary`` assignment of the progress-summary
  annotation script; each later one is the model's text inside ``<summary>`` (``match.group(1)``
  stripped), fed back as it is: ``summary_feedback: inner``;
- tool-call JSON: ``json.dumps`` of the call payload without ``ensure_ascii``, so non-ASCII is
  escaped: ``tool_call_ascii: true``;
- a proposed step whose intent is masked: the no-verbal critique scripts keep the first
  ``<tool_call>`` block only (``re.search``): ``masked_calls: first``;
- markers: the sizes of the critique converter's marker code (``max(a, base // b)`` per branch),
  portrait images get the mobile table, drags are drawn only when both ends are named, and the
  marks are drawn on the screenshot at its own resolution before LlamaFactory resizes it;
- frame: ``image_max_pixels`` of the training YAML and LlamaFactory's default
  ``image_min_pixels`` (``ProcessorArguments``);
- chat template: LlamaFactory's ``qwen3_vl`` slots and the Qwen2-VL plugin's vision tokens,
  compared with hivig's own ``chat_template_v1.jinja``, which is written when it renders the same.

A repository is recognised by the sha256 of every file read; any other content is refused with a
one-line ``ReferenceImportError`` naming the files that differ.
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import string
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from hivig.messages import ImagePart, ImageRef, TextPart
from hivig.profiles._profile import template_file_text
from hivig.prompts import PromptError, PromptTemplate, parse_template

REVISION = "fd1d4a2"
"""The revision of G-JWLee/HiViG this importer supports."""

CRITIQUE_SFT = "examples/data_preprocess/new_scalecua_critique_sft_llama_factory.py"
SUMMARY_SFT = "examples/data_preprocess/new_scalecua_summary_sft_llama_factory.py"
PROGRESS_SUMMARY = (
    "examples/data_preprocess/new_preprocess_scalecua_progress_summary_annotation_grounding.py"
)
CHOSEN_NO_VERBAL = (
    "examples/data_preprocess/"
    "new_preprocess_scalecua_critic_chosen_dataset_grounding_new_no_verbal.py"
)
REJECTED_NO_VERBAL = (
    "examples/data_preprocess/"
    "new_preprocess_scalecua_critic_rejected_dataset_grounding_new_no_verbal.py"
)
TRAIN_YAML = "examples/train_full/qwen3vl_full_sft_critic_merged.yaml"
LF_TEMPLATE = "src/llamafactory/data/template.py"
LF_MM_PLUGIN = "src/llamafactory/data/mm_plugin.py"
LF_MODEL_ARGS = "src/llamafactory/hparams/model_args.py"

SOURCES = (
    CRITIQUE_SFT,
    SUMMARY_SFT,
    PROGRESS_SUMMARY,
    CHOSEN_NO_VERBAL,
    REJECTED_NO_VERBAL,
    TRAIN_YAML,
    LF_TEMPLATE,
    LF_MM_PLUGIN,
    LF_MODEL_ARGS,
)
"""Every file the importer reads, relative to the repository root."""

KNOWN_REVISIONS: dict[str, dict[str, str]] = {
    REVISION: {
        CRITIQUE_SFT: "8d214068803b65b7f06a85ed5e2794cfded76f21490b756a8d75488e6ffd208c",
        SUMMARY_SFT: "816c32bd29be117820dbadf181675c6992c5da2df9a5379282a5086b8e9051f9",
        PROGRESS_SUMMARY: "368ae10d8a0ebb417838a7a831db106485e236b4e301849a733b63a5f35fb7f3",
        CHOSEN_NO_VERBAL: "41b2634b59cbd354d599f87a6718a08398058ab9c6a7d0563570e22192035bff",
        REJECTED_NO_VERBAL: "31bf524f3b9c8ff64db945c56750fa50f9053966a35a0615a1a4f179a3871bcf",
        TRAIN_YAML: "be020f5bbb4fb7088f512fd8cbd43571a6f56173b9dac9acd117342c109ad379",
        LF_TEMPLATE: "ddf2e5a2171d246864c7b4bc5b9c8daebee200b94a63fd46430564868fc284f2",
        LF_MM_PLUGIN: "8afbaa00788e53d8590a1cb91be08482402fc9b90943fe9c659ffeada5c73d2b",
        LF_MODEL_ARGS: "752637827fc84111206f11f864a57f654608c5222ae7c6cbbc244c5b9a736675",
    }
}
"""sha256 of each file read, per supported revision (digests of their files, not their text)."""

PROFILE_NAME = "hivig-reference"
IMAGE_MARKER = "<image>"
"""LlamaFactory's image placeholder (``IMAGE_PLACEHOLDER`` default)."""

GENERATION = {
    "history_max_tokens": 4096,
    "critique_max_tokens": 4096,
    "observe_deadline_s": 120.0,
    "critique_deadline_s": 120.0,
    "recurrence_note": False,
}
"""Answer budget of the reference critic: long thinking answers, no hivig recurrence note."""

# Their placeholder names -> hivig's, per template section.
_CRITIQUE_SYSTEM = {"platform_action_space": "action_space", "error_dimension_str": "taxonomy"}
_CRITIQUE_USER = {"intent": "task", "trajectory": "history", "current_proposed_step": "step"}
_HISTORY_SYSTEM = {"platform_action_space": "action_space"}
_HISTORY_USER = {"intent": "task", "previous_summary": "previous_summary", "proposed_step": "step"}
_CRITIQUE_IMAGES = ("screenshot",)
_HISTORY_IMAGES = ("before", "after")

# Their action-space keys -> hivig's action-space names.
_SPACES = {"desktop": "computer_use", "mobile": "mobile_use"}

# Marker-code variable -> profile key; ``outer`` is gap + arm.
_MARKER_VARS = {"gap": "gap", "outer": "arm", "line_thickness": "width", "arrow_head_size": "head"}


class ReferenceImportError(ValueError):
    """The folder is not a supported copy of the authors' repository; the message is one line."""


@dataclass(frozen=True)
class ImportReport:
    """What ``import_reference`` did.

    Attributes:
        out: The profile folder written.
        revision: The revision label whose digests matched (``fd1d4a2`` for the built-in table).
        digests: sha256 of every file read, by repository path.
        files: Names of the files written into ``out``, in writing order.
        settings: The settings written to ``profile.yaml`` (name, source, render, frame,
            generation, marker_geometry).
        chat_template: Where the chat template came from and why.
        preprocessing: LlamaFactory's image preprocessing as read from its source (resample
            filter, rounding, minimum side), for people; the frame policy implements it.
    """

    out: Path
    revision: str
    digests: dict[str, str]
    files: tuple[str, ...]
    settings: dict[str, Any]
    chat_template: str
    preprocessing: dict[str, str] = field(default_factory=dict)


def import_reference(
    repo: str | Path,
    out: str | Path,
    *,
    known: Mapping[str, Mapping[str, str]] | None = None,
) -> ImportReport:
    """Write a profile folder reproducing the authors' critic interface from their repository.

    Nothing is written unless every check passes: the digests, the parse of every constant and
    expression, the byte-for-byte round trip of both templates against ``str.format`` and the
    chat-template comparison. The folder written is then read back with ``load_profile``.

    Args:
        repo: Root of a local copy of G-JWLee/HiViG (a clone or an unpacked archive; git is
            never used).
        out: Profile folder to write (created if needed; the profile's files are replaced).
        known: ``{revision: {path: sha256}}`` of the accepted file versions; the built-in
            ``KNOWN_REVISIONS`` by default. Each table must cover every path in ``SOURCES``.

    Returns:
        An ``ImportReport``.

    Raises:
        ReferenceImportError: The folder is missing, lacks a file, holds other versions of the
            files, or their code no longer has the expected shape (one-line message).
        OSError: ``out`` cannot be written.
    """
    root = Path(repo)
    tables = {k: dict(v) for k, v in (KNOWN_REVISIONS if known is None else known).items()}
    texts = _read_sources(root, tuple(tables))
    digests = {path: hashlib.sha256(data).hexdigest() for path, data in texts.items()}
    revision = _match_revision(root, digests, tables)
    extracted = _extract({path: _decode(path, data) for path, data in texts.items()})
    source = _source_line(revision, digests)
    files = _profile_files(extracted, source)
    target = Path(out)
    _write_checked(target, files)
    return ImportReport(
        out=target,
        revision=revision,
        digests=digests,
        files=tuple(files),
        settings=extracted.settings(source),
        chat_template=(
            "hivig's chat_template_v1.jinja: it renders LlamaFactory's qwen3_vl conversation "
            "and generation prompt byte for byte"
        ),
        preprocessing=extracted.preprocessing,
    )


# ---------------------------------------------------------------------------------------------
# Sources and digests


def _read_sources(root: Path, revisions: tuple[str, ...]) -> dict[str, bytes]:
    supported = ", ".join(revisions)
    if not root.is_dir():
        raise ReferenceImportError(f"{root}: no such folder (pass a copy of G-JWLee/HiViG)")
    missing = [p for p in SOURCES if not (root / p).is_file()]
    if len(missing) == len(SOURCES):
        raise ReferenceImportError(
            f"{root} is not a copy of G-JWLee/HiViG: none of the {len(SOURCES)} files read "
            f"(e.g. {SOURCES[0]}) is there; supported revision {supported}"
        )
    if missing:
        raise ReferenceImportError(
            f"{root} is not a complete copy of G-JWLee/HiViG (supported revision {supported}): "
            f"missing {', '.join(missing)}"
        )
    return {p: (root / p).read_bytes() for p in SOURCES}


def _match_revision(
    root: Path, digests: Mapping[str, str], tables: Mapping[str, Mapping[str, str]]
) -> str:
    if not tables:
        raise ValueError("known: at least one revision table is needed")
    differing: dict[str, list[str]] = {}
    for label, table in tables.items():
        lacking = [p for p in SOURCES if p not in table]
        if lacking:
            raise ValueError(f"known[{label!r}] lacks digests for {', '.join(lacking)}")
        differing[label] = [p for p in SOURCES if table[p] != digests[p]]
        if not differing[label]:
            return label
    closest = min(differing, key=lambda k: len(differing[k]))
    supported = ", ".join(tables)
    raise ReferenceImportError(
        f"{root} is not a supported revision of G-JWLee/HiViG (supported: {supported}); "
        f"these files differ from {closest}: {', '.join(differing[closest])}"
    )


def _decode(path: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReferenceImportError(f"{path}: not UTF-8 text ({e.reason})") from None


def _source_line(revision: str, digests: Mapping[str, str]) -> str:
    checked = ", ".join(f"{Path(p).name}={d[:16]}" for p, d in digests.items())
    return f"G-JWLee/HiViG revision {revision}; sha256 checked: {checked}"


# ---------------------------------------------------------------------------------------------
# A closed expression evaluator


class _Unsupported(Exception):
    """An expression outside the evaluator's closed set."""


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    """Evaluate a literal-like expression: constants, names, containers, strip/join, f-strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise _Unsupported(f"unknown name {node.id}")
        return env[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, env) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _Unsupported("dict unpacking")
        pairs = zip(node.keys, node.values, strict=True)
        return {_eval(k, env): _eval(v, env) for k, v in pairs}  # type: ignore[arg-type]
    if isinstance(node, ast.JoinedStr):
        return "".join(_eval_fstring_part(p, env) for p in node.values)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return _eval_comprehension(node, env)
    if isinstance(node, ast.Call):
        return _eval_method(node, env)
    if isinstance(node, ast.BinOp):
        return _eval_arithmetic(node, env)
    raise _Unsupported(type(node).__name__)


def _eval_fstring_part(node: ast.AST, env: Mapping[str, Any]) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.FormattedValue) and node.conversion == -1 and node.format_spec is None:
        value = _eval(node.value, env)
        if isinstance(value, str):
            return value
    raise _Unsupported("f-string field")


def _eval_comprehension(node: ast.ListComp | ast.GeneratorExp, env: Mapping[str, Any]) -> list[Any]:
    if len(node.generators) != 1:
        raise _Unsupported("nested comprehension")
    gen = node.generators[0]
    if gen.ifs or gen.is_async or not isinstance(gen.target, ast.Name):
        raise _Unsupported("comprehension form")
    items = _eval(gen.iter, env)
    if not isinstance(items, list):
        raise _Unsupported("comprehension over a non-list")
    return [_eval(node.elt, {**env, gen.target.id: item}) for item in items]


def _eval_method(node: ast.Call, env: Mapping[str, Any]) -> str:
    func = node.func
    if node.keywords or not isinstance(func, ast.Attribute):
        raise _Unsupported("call")
    owner = _eval(func.value, env)
    if not isinstance(owner, str):
        raise _Unsupported("method of a non-string")
    if func.attr == "strip" and not node.args:
        return owner.strip()
    if func.attr == "join" and len(node.args) == 1:
        items = _eval(node.args[0], env)
        if isinstance(items, list) and all(isinstance(i, str) for i in items):
            return owner.join(items)
    raise _Unsupported(f"method {func.attr}")


_INT_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
}


def _eval_arithmetic(node: ast.BinOp, env: Mapping[str, Any]) -> int:
    left, right = _eval(node.left, env), _eval(node.right, env)
    op = _INT_OPS.get(type(node.op))
    if op is None or not all(type(v) is int and abs(v) < 2**40 for v in (left, right)):
        raise _Unsupported("arithmetic")
    if isinstance(node.op, ast.FloorDiv) and right == 0:
        raise _Unsupported("division by zero")
    return op(left, right)


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level ``NAME = expr`` bindings whose value the evaluator can compute, in order."""
    env: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if not isinstance(target, ast.Name):
            continue
        try:
            env[target.id] = _eval(value, env)
        except (_Unsupported, TypeError):  # TypeError: e.g. an unhashable dict key
            env.pop(target.id, None)  # a later reference must not see a stale value
    return env


# ---------------------------------------------------------------------------------------------
# Extraction


class _ChatML(NamedTuple):
    system: str
    user: str
    assistant: str
    image: str  # what one image placeholder becomes before the processor expands its tokens


@dataclass
class _Extracted:
    critique_system: str
    critique_user: str
    history_system: str
    history_user: str
    spaces: dict[str, str]  # their keys: desktop, mobile
    taxonomy: str
    initial_summary: str
    tool_call_ascii: bool
    masked_calls: str
    geometry: dict[str, dict[str, list[int]]]
    size_class: str
    drag_arrows: bool
    image_max_pixels: int
    image_min_pixels: int
    chatml: _ChatML
    preprocessing: dict[str, str]

    def settings(self, source: str) -> dict[str, Any]:
        return {
            "name": PROFILE_NAME,
            "source": source,
            "render": {
                "tool_call_ascii": self.tool_call_ascii,
                "masked_calls": self.masked_calls,
                "summary_feedback": "inner",
            },
            "frame": {
                "geometry": "llamafactory",
                "image_max_pixels": self.image_max_pixels,
                "image_min_pixels": self.image_min_pixels,
                "markers": "original",
                "size_class": self.size_class,
                "drag_arrows": self.drag_arrows,
            },
            "generation": dict(GENERATION),
            "marker_geometry": self.geometry,
        }


def _extract(texts: Mapping[str, str]) -> _Extracted:
    trees = {p: _parse_python(p, t) for p, t in texts.items() if p.endswith(".py")}
    critique = _module_constants(trees[CRITIQUE_SFT])
    summary = _module_constants(trees[SUMMARY_SFT])
    spaces = _action_spaces(CRITIQUE_SFT, critique)
    if _action_spaces(SUMMARY_SFT, summary) != spaces:
        raise ReferenceImportError(
            f"{SUMMARY_SFT}: action_spaces differ from those of {CRITIQUE_SFT}; a profile has one "
            "action-space text per platform"
        )
    geometry, size_class, drag_arrows = _marker_code(CRITIQUE_SFT, trees[CRITIQUE_SFT])
    masked = {_masked_calls(p, trees[p]) for p in (CHOSEN_NO_VERBAL, REJECTED_NO_VERBAL)}
    if len(masked) != 1:
        raise ReferenceImportError(
            f"{CHOSEN_NO_VERBAL} and {REJECTED_NO_VERBAL} mask intents differently"
        )
    return _Extracted(
        critique_system=_string(CRITIQUE_SFT, critique, "CRITIC_GENERATION_FORMAT"),
        critique_user=_string(CRITIQUE_SFT, critique, "USER_PROMPT"),
        history_system=_string(SUMMARY_SFT, summary, "SUMMARY_SYSTEM_PROMPT"),
        history_user=_string(SUMMARY_SFT, summary, "SUMMARY_USER_PROMPT"),
        spaces=spaces,
        taxonomy=_string(CRITIQUE_SFT, critique, "error_dimension_str"),
        initial_summary=_initial_summary(PROGRESS_SUMMARY, trees[PROGRESS_SUMMARY]),
        tool_call_ascii=_tool_call_ascii(PROGRESS_SUMMARY, trees[PROGRESS_SUMMARY]),
        masked_calls=masked.pop(),
        geometry=geometry,
        size_class=size_class,
        drag_arrows=drag_arrows,
        image_max_pixels=_image_max_pixels(TRAIN_YAML, texts[TRAIN_YAML]),
        image_min_pixels=_image_min_pixels(LF_MODEL_ARGS, trees[LF_MODEL_ARGS]),
        chatml=_chatml(trees[LF_TEMPLATE], trees[LF_MM_PLUGIN]),
        preprocessing=_preprocessing(LF_MM_PLUGIN, trees[LF_MM_PLUGIN]),
    )


def _parse_python(path: str, text: str) -> ast.Module:
    try:
        return ast.parse(text, filename=path)
    except SyntaxError as e:
        raise ReferenceImportError(f"{path}: not valid Python (line {e.lineno})") from None


def _string(path: str, env: Mapping[str, Any], name: str) -> str:
    value = env.get(name)
    if not isinstance(value, str):
        raise ReferenceImportError(
            f"{path}: no module-level string constant {name} of a supported form"
        )
    return value


def _action_spaces(path: str, env: Mapping[str, Any]) -> dict[str, str]:
    value = env.get("action_spaces")
    if not (
        isinstance(value, dict)
        and set(value) == set(_SPACES)
        and all(isinstance(v, str) for v in value.values())
    ):
        raise ReferenceImportError(
            f"{path}: no module-level action_spaces dict of strings keyed {sorted(_SPACES)}"
        )
    return value


def _functions(tree: ast.AST) -> Iterable[ast.FunctionDef]:
    return (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))


def _function(path: str, tree: ast.AST, name: str) -> ast.FunctionDef:
    for fn in _functions(tree):
        if fn.name == name:
            return fn
    raise ReferenceImportError(f"{path}: no function {name}")


def _initial_summary(path: str, tree: ast.Module) -> str:
    fn = _function(path, tree, "process_single_trajectory")
    for node in _in_source_order(fn):
        if (
            isinstance(node, ast.Assign)
            and [_name(t) for t in node.targets] == ["rolling_summary"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise ReferenceImportError(
        f"{path}: process_single_trajectory assigns no string to rolling_summary"
    )


def _in_source_order(tree: ast.AST) -> list[ast.AST]:
    nodes = [n for n in ast.walk(tree) if hasattr(n, "lineno")]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _is_call(node: ast.AST, owner: str, attr: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attr
        and _name(node.func.value) == owner
    )


def _tool_call_ascii(path: str, tree: ast.Module) -> bool:
    fn = _function(path, tree, "map_old_action_to_agent_action")
    calls = [
        n
        for n in ast.walk(fn)
        if _is_call(n, "json", "dumps")
        and isinstance(n, ast.Call)
        and [_name(a) for a in n.args[:1]] == ["json_payload"]
    ]
    if not calls:
        raise ReferenceImportError(f"{path}: no json.dumps(json_payload) in the tool-call mapper")
    found = set()
    for call in calls:
        kw = {k.arg: k.value for k in call.keywords}
        if set(kw) - {"ensure_ascii"}:
            raise ReferenceImportError(f"{path}: json.dumps of tool calls takes other options")
        flag = kw.get("ensure_ascii")
        if flag is None:
            found.add(True)  # json.dumps' default
        elif isinstance(flag, ast.Constant) and isinstance(flag.value, bool):
            found.add(flag.value)
        else:
            raise ReferenceImportError(f"{path}: ensure_ascii of tool calls is not a constant")
    if len(found) != 1:
        raise ReferenceImportError(f"{path}: tool calls are written with mixed ensure_ascii")
    return found.pop()


def _masked_calls(path: str, tree: ast.Module) -> str:
    fn = _function(path, tree, "extract_tool_call_only")
    kinds = set()
    for node in ast.walk(fn):
        if _is_call(node, "re", "search") or _is_call(node, "re", "match"):
            kinds.add("first")
        elif _is_call(node, "re", "findall") or _is_call(node, "re", "finditer"):
            kinds.add("all")
    if len(kinds) != 1:
        raise ReferenceImportError(
            f"{path}: extract_tool_call_only keeps neither clearly the first nor all tool calls"
        )
    return kinds.pop()


def _marker_code(path: str, tree: ast.Module) -> tuple[dict[str, dict[str, list[int]]], str, bool]:
    fn = _function(path, tree, "get_or_create_marked_image")
    assigns = _simple_assigns(fn.body)
    branch = next(
        (
            n
            for n in ast.walk(fn)
            if isinstance(n, ast.If)
            and isinstance(n.test, ast.Name)
            and "gap" in _simple_assigns(n.body)
        ),
        None,
    )
    if branch is None or not isinstance(branch.test, ast.Name):
        raise ReferenceImportError(f"{path}: no marker-size if/else in get_or_create_marked_image")
    size_class = _size_class(path, assigns.get(branch.test.id))
    base = _base_name(path, assigns)
    geometry = {
        "mobile": _marker_table(path, _simple_assigns(branch.body), base),
        "desktop": _marker_table(path, _simple_assigns(branch.orelse), base),
    }
    return geometry, size_class, _drag_arrows(path, fn, assigns)


def _simple_assigns(body: Iterable[ast.stmt]) -> dict[str, ast.expr]:
    """``name = expr`` statements of a block (its nested blocks included), by name."""
    out: dict[str, ast.expr] = {}
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                name = _name(node.targets[0])
                if name:
                    out.setdefault(name, node.value)
    return out


def _size_class(path: str, test: ast.expr | None) -> str:
    # ``height > width`` (portrait means mobile) is the aspect rule.
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Gt)
        and _name(test.left) == "height"
        and _name(test.comparators[0]) == "width"
    ):
        return "aspect"
    raise ReferenceImportError(f"{path}: the marker size class is not the portrait test")


def _base_name(path: str, assigns: Mapping[str, ast.expr]) -> str:
    for name, value in assigns.items():
        if (
            isinstance(value, ast.Call)
            and _name(value.func) == "min"
            and [_name(a) for a in value.args] == ["width", "height"]
        ):
            return name
    raise ReferenceImportError(f"{path}: no base = min(width, height) in the marker code")


def _max_floor(path: str, node: ast.expr, base: str) -> list[int]:
    """``max(a, base // b)`` -> ``[a, b]``."""
    if (
        isinstance(node, ast.Call)
        and _name(node.func) == "max"
        and not node.keywords
        and len(node.args) == 2
    ):
        low, scaled = node.args
        if (
            isinstance(low, ast.Constant)
            and type(low.value) is int
            and isinstance(scaled, ast.BinOp)
            and isinstance(scaled.op, ast.FloorDiv)
            and _name(scaled.left) == base
            and isinstance(scaled.right, ast.Constant)
            and type(scaled.right.value) is int
            and scaled.right.value > 0
        ):
            return [low.value, scaled.right.value]
    raise ReferenceImportError(
        f"{path}: a marker size (line {node.lineno}) is not max(N, {base} // M)"
    )


def _marker_table(path: str, assigns: Mapping[str, ast.expr], base: str) -> dict[str, list[int]]:
    missing = [v for v in _MARKER_VARS if v not in assigns]
    if missing:
        raise ReferenceImportError(f"{path}: the marker branch sets no {', '.join(missing)}")
    outer = assigns["outer"]
    if not (
        isinstance(outer, ast.BinOp)
        and isinstance(outer.op, ast.Add)
        and _name(outer.left) == "gap"
    ):
        raise ReferenceImportError(f"{path}: outer (line {outer.lineno}) is not gap + max(...)")
    table = {
        "gap": _max_floor(path, assigns["gap"], base),
        "arm": _max_floor(path, outer.right, base),
        "width": _max_floor(path, assigns["line_thickness"], base),
        "head": _max_floor(path, assigns["arrow_head_size"], base),
    }
    return table


def _drag_arrows(path: str, fn: ast.FunctionDef, assigns: Mapping[str, ast.expr]) -> bool:
    drags = assigns.get("drag_actions")
    if not isinstance(drags, ast.Set):
        raise ReferenceImportError(f"{path}: no drag_actions set in the marker code")
    if "left_click_drag" not in {_const(e) for e in drags.elts}:
        return False
    # A desktop drag names only its end (``coordinate``): when an arrow needs ``coordinate2``
    # too, it is never drawn for one.
    needs_end = any(
        isinstance(n, ast.Compare)
        and _const(n.left) == "coordinate2"
        and isinstance(n.ops[0], ast.In)
        for n in ast.walk(fn)
    )
    return not needs_end


def _image_max_pixels(path: str, text: str) -> int:
    import yaml

    try:
        body = yaml.safe_load(text)
    except yaml.YAMLError:
        raise ReferenceImportError(f"{path}: not valid YAML") from None
    if not isinstance(body, dict):
        raise ReferenceImportError(f"{path}: not a mapping of settings")
    if body.get("template") != "qwen3_vl":
        raise ReferenceImportError(f"{path}: template is {body.get('template')!r}, not qwen3_vl")
    value = body.get("image_max_pixels")
    if type(value) is not int or value <= 0:
        raise ReferenceImportError(f"{path}: no positive integer image_max_pixels")
    return value


def _class(path: str, tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise ReferenceImportError(f"{path}: no class {name}")


def _class_fields(cls: ast.ClassDef) -> dict[str, ast.expr]:
    return {
        stmt.target.id: stmt.value
        for stmt in cls.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value
    }


def _image_min_pixels(path: str, tree: ast.Module) -> int:
    value = _class_fields(_class(path, tree, "ProcessorArguments")).get("image_min_pixels")
    default = None
    if isinstance(value, ast.Call) and _name(value.func) == "field":
        default = next((k.value for k in value.keywords if k.arg == "default"), None)
    try:
        pixels = _eval(default, {}) if default is not None else None
    except _Unsupported:
        pixels = None
    if type(pixels) is not int or pixels <= 0:
        raise ReferenceImportError(
            f"{path}: ProcessorArguments.image_min_pixels has no integer default"
        )
    return pixels


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _slot(path: str, node: ast.expr | None, what: str) -> str:
    # StringFormatter(slots=["...{{content}}..."])
    value = None
    if isinstance(node, ast.Call) and _name(node.func) == "StringFormatter":
        slots = _keywords(node).get("slots")
        if isinstance(slots, ast.List) and len(slots.elts) == 1:
            value = _const(slots.elts[0])
    if not isinstance(value, str) or value.count("{{content}}") != 1:
        raise ReferenceImportError(f"{path}: qwen3_vl {what} is not one slot with {{{{content}}}}")
    return value


def _chatml(template: ast.Module, plugin: ast.Module) -> _ChatML:
    call = next(
        (
            n
            for n in ast.walk(template)
            if isinstance(n, ast.Call)
            and _name(n.func) == "register_template"
            and _const(_keywords(n).get("name")) == "qwen3_vl"
        ),
        None,
    )
    if call is None:
        raise ReferenceImportError(f"{LF_TEMPLATE}: no register_template(name='qwen3_vl', ...)")
    kw = _keywords(call)
    unsupported = sorted({"format_prefix", "default_system", "thought_words"} & set(kw))
    if unsupported or _name(kw.get("template_class")) != "ReasoningTemplate":
        raise ReferenceImportError(
            f"{LF_TEMPLATE}: qwen3_vl is not the plain reasoning ChatML template this importer "
            "knows"
        )
    mm = kw.get("mm_plugin")
    mm_kw = _keywords(mm) if isinstance(mm, ast.Call) else {}
    image_token = _const(mm_kw.get("image_token"))
    plugin_name = _const(mm_kw.get("name"))
    if not isinstance(image_token, str) or not isinstance(plugin_name, str):
        raise ReferenceImportError(f"{LF_TEMPLATE}: qwen3_vl names no mm_plugin image token")
    bos, eos = _vision_tokens(plugin, plugin_name)
    return _ChatML(
        system=_slot(LF_TEMPLATE, kw.get("format_system"), "format_system"),
        user=_slot(LF_TEMPLATE, kw.get("format_user"), "format_user"),
        assistant=_slot(LF_TEMPLATE, kw.get("format_assistant"), "format_assistant"),
        image=f"{bos}{image_token}{eos}",
    )


def _const(node: ast.AST | None) -> Any:
    return node.value if isinstance(node, ast.Constant) else None


def _plugin_chain(tree: ast.Module, plugin_name: str) -> list[ast.ClassDef]:
    """The plugin class registered as ``plugin_name`` and its bases, nearest first."""
    registry = next(
        (
            s.value
            for s in tree.body
            if isinstance(s, ast.Assign)
            and [_name(t) for t in s.targets] == ["PLUGINS"]
            and isinstance(s.value, ast.Dict)
        ),
        None,
    )
    entries = (
        {_const(k): _name(v) for k, v in zip(registry.keys, registry.values, strict=True) if k}
        if isinstance(registry, ast.Dict)
        else {}
    )
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    chain: list[ast.ClassDef] = []
    current = entries.get(plugin_name)
    while current in classes and len(chain) < 16:
        cls = classes[current]
        chain.append(cls)
        current = _name(cls.bases[0]) if cls.bases else None
    if not chain:
        raise ReferenceImportError(f"{LF_MM_PLUGIN}: no plugin class registered as {plugin_name}")
    return chain


def _vision_tokens(tree: ast.Module, plugin_name: str) -> tuple[str, str]:
    found: dict[str, Any] = {}
    for cls in _plugin_chain(tree, plugin_name):
        for key, value in _class_fields(cls).items():
            found.setdefault(key, _const(value))
    bos, eos = found.get("vision_bos_token"), found.get("vision_eos_token")
    if not isinstance(bos, str) or not isinstance(eos, str):
        raise ReferenceImportError(f"{LF_MM_PLUGIN}: {plugin_name} names no vision start/end")
    return bos, eos


def _preprocessing(path: str, tree: ast.Module) -> dict[str, str]:
    """Check LlamaFactory's first resize is the one ``geometry: llamafactory`` implements."""
    methods = [
        fn
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef))
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef) and fn.name == "_preprocess_image"
    ]
    base = [fn for fn in methods if "image_max_pixels" in {a.arg for a in fn.args.args}]
    if len(base) != 1:
        raise ReferenceImportError(f"{path}: no single _preprocess_image(image_max_pixels, ...)")
    resizes = [n for fn in methods for n in ast.walk(fn) if _is_method(n, "resize")]
    if not resizes or any(n.keywords or len(n.args) != 1 for n in resizes):  # type: ignore[attr-defined]
        raise ReferenceImportError(f"{path}: an image resize passes a resample filter or options")
    rounding = {
        _name(v.func)
        for n in ast.walk(base[0])
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple)
        for v in n.value.elts
        if isinstance(v, ast.Call)
    }
    if rounding != {"int"}:
        raise ReferenceImportError(f"{path}: the resized sides are not truncated with int()")
    return {
        "resample": "PIL Image.resize default: BICUBIC (NEAREST for modes 1 and P, alpha "
        "premultiplied for RGBA), applied before the RGB conversion",
        "rounding": "int() truncation of side * sqrt(limit / (w * h))",
        "order": "shrink to image_max_pixels, then grow to image_min_pixels, then the "
        "processor's own resize",
    }


def _is_method(node: ast.AST, attr: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attr
    )


# ---------------------------------------------------------------------------------------------
# Templates


def _convert(fmt: str, fields: Mapping[str, str], images: tuple[str, ...], where: str) -> str:
    """A ``str.format`` prompt with ``<image>`` markers as a ``string.Template`` text.

    Literal ``$`` becomes ``$$``; ``{{``/``}}`` become ``{``/``}``; each ``{theirs}`` becomes
    ``$ours``; the i-th ``<image>`` becomes ``$images[i]``.
    """
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError as e:
        raise ReferenceImportError(f"{where}: not a str.format template ({e})") from None
    parts: list[tuple[bool, str]] = []  # (is_placeholder, text)
    slots = iter(images)
    used: list[str] = []
    for literal, name, spec, conversion in parsed:
        for i, piece in enumerate(literal.split(IMAGE_MARKER)):
            if i:
                slot = next(slots, None)
                if slot is None:
                    raise ReferenceImportError(
                        f"{where}: more than {len(images)} {IMAGE_MARKER} marker(s)"
                    )
                parts.append((True, slot))
            parts.append((False, piece.replace("$", "$$")))
        if name is None:
            continue
        if name not in fields:
            raise ReferenceImportError(
                f"{where}: unknown placeholder {{{name}}} (known: {', '.join(fields)})"
            )
        if spec or conversion:
            raise ReferenceImportError(f"{where}: placeholder {{{name}}} has a format spec")
        used.append(name)
        parts.append((True, fields[name]))
    if next(slots, None) is not None:
        raise ReferenceImportError(f"{where}: fewer than {len(images)} {IMAGE_MARKER} marker(s)")
    if set(used) != set(fields):
        absent = [f"{{{n}}}" for n in fields if n not in used]
        raise ReferenceImportError(f"{where}: no placeholder {', '.join(absent)}")
    return _join_template(parts)


def _join_template(parts: list[tuple[bool, str]]) -> str:
    out: list[str] = []
    for i, (is_placeholder, text) in enumerate(parts):
        if not is_placeholder:
            out.append(text)
            continue
        after = parts[i + 1] if i + 1 < len(parts) else (True, "")
        first = after[1][:1]
        # ``$name`` followed by an identifier character would read as a longer name.
        glued = not after[0] and (first.isalnum() or first == "_")
        out.append(f"${{{text}}}" if glued else f"${text}")
    return "".join(out)


def _template_text(system: str, user: str, images: tuple[str, ...]) -> str:
    # The profile's own file format, images inline (the name and version are not written).
    return template_file_text(PromptTemplate("", 1, system, user, images, inline_images=True))


def _sentinel(name: str) -> str:
    # Dollars, braces and a newline: every escape the conversion makes is exercised.
    return "\u27e6" + name + " $1 $$ ${x} {y} {{z}}\n\u27e7"


def _round_trip(
    name: str,
    text: str,
    system: tuple[str, Mapping[str, str]],
    user: tuple[str, Mapping[str, str]],
    images: tuple[str, ...],
    real: Mapping[str, str],
) -> None:
    """Refuse unless rendering ``text`` gives what ``str.format`` gives on their constants."""
    try:
        template = parse_template(name, 1, text)
    except PromptError as e:
        raise ReferenceImportError(f"{name}: the converted template does not parse ({e})") from None
    ours = [*system[1].values(), *user[1].values()]
    for overrides in ({}, real):
        values = {n: overrides.get(n, _sentinel(n)) for n in ours}
        refs = {slot: ImageRef(f"{slot}.png") for slot in images}
        try:
            messages = template.render(**values, **refs)
        except PromptError as e:
            raise ReferenceImportError(f"{name}: the converted template fails ({e})") from None
        got_system = messages[0].text()
        got_user = "".join(
            p.text if isinstance(p, TextPart) else IMAGE_MARKER for p in messages[1].content
        )
        order = [p.image.path for p in messages[1].content if isinstance(p, ImagePart)]
        want_system = system[0].format(**{k: values[v] for k, v in system[1].items()})
        want_user = user[0].format(**{k: values[v] for k, v in user[1].items()})
        if (got_system, got_user) != (want_system, want_user) or order != [
            refs[s].path for s in images
        ]:
            raise ReferenceImportError(
                f"{name}: the converted template does not render byte for byte as their "
                "str.format does"
            )


# ---------------------------------------------------------------------------------------------
# Chat template


def _raise(message: str) -> None:
    raise ValueError(message)


def _llamafactory_text(
    chatml: _ChatML, system: str, user: list[str | None], assistant: str | None
) -> str:
    """What LlamaFactory's ``qwen3_vl`` template produces (``None`` in ``user`` is an image)."""
    content = "".join(chatml.image if p is None else p for p in user)
    text = chatml.system.replace("{{content}}", system, 1)
    text += chatml.user.replace("{{content}}", content, 1)
    if assistant is not None:
        text += chatml.assistant.replace("{{content}}", assistant, 1)
    return text


def _chat_cases() -> list[tuple[str, list[str | None], str | None]]:
    think = "<think>\nreasoning $ {x}\n</think>\n<criticism>\nverdict\n</criticism>"
    return [
        ("system\nprompt", ["goal\n\nCurrent:\n", None, "\n\nStep:\nx"], think),
        ("system\nprompt", ["goal\n\nCurrent:\n", None, "\n\nStep:\nx"], None),
        ("s", ["goal\nBefore:\n", None, "\n\nStep\n\nAfter:\n", None], think),
        ("s", ["goal\nBefore:\n", None, "\n\nStep\n\nAfter:\n", None], None),
    ]


def _chat_template(chatml: _ChatML) -> str:
    """The chat template: hivig's ``chat_template_v1.jinja`` if it renders as ``qwen3_vl`` does."""
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ReferenceImportError(
            "the chat-template check needs jinja2 (install hivig[serve] or hivig[train])"
        ) from None
    text = resources.files("hivig.prompts").joinpath("chat_template_v1.jinja").read_text("utf-8")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    template = env.from_string(text)
    for system, user, assistant in _chat_cases():
        parts = [{"type": "image"} if p is None else {"type": "text", "text": p} for p in user]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": parts},
        ]
        if assistant is not None:
            messages.append({"role": "assistant", "content": assistant})
        got = template.render(messages=messages, add_generation_prompt=assistant is None)
        if got != _llamafactory_text(chatml, system, user, assistant):
            raise ReferenceImportError(
                f"{LF_TEMPLATE}: hivig's chat_template_v1.jinja renders differently from "
                "LlamaFactory's qwen3_vl template; this revision is not supported"
            )
    return text


# ---------------------------------------------------------------------------------------------
# The profile folder


def _profile_files(x: _Extracted, source: str) -> dict[str, str]:
    critique = _template_text(
        _convert(x.critique_system, _CRITIQUE_SYSTEM, (), f"{CRITIQUE_SFT}: the system prompt"),
        _convert(
            x.critique_user, _CRITIQUE_USER, _CRITIQUE_IMAGES, f"{CRITIQUE_SFT}: the user prompt"
        ),
        _CRITIQUE_IMAGES,
    )
    history = _template_text(
        _convert(x.history_system, _HISTORY_SYSTEM, (), f"{SUMMARY_SFT}: the system prompt"),
        _convert(x.history_user, _HISTORY_USER, _HISTORY_IMAGES, f"{SUMMARY_SFT}: the user prompt"),
        _HISTORY_IMAGES,
    )
    real = {"action_space": x.spaces["desktop"], "taxonomy": x.taxonomy}
    _round_trip(
        "critic_critique",
        critique,
        (x.critique_system, _CRITIQUE_SYSTEM),
        (x.critique_user, _CRITIQUE_USER),
        _CRITIQUE_IMAGES,
        real,
    )
    _round_trip(
        "critic_history",
        history,
        (x.history_system, _HISTORY_SYSTEM),
        (x.history_user, _HISTORY_USER),
        _HISTORY_IMAGES,
        real,
    )
    files = {
        "critic_critique.txt": critique,
        "critic_history.txt": history,
        **{f"action_space_{_SPACES[k]}.txt": v for k, v in x.spaces.items()},
        "taxonomy.txt": x.taxonomy,
        "initial_summary.txt": x.initial_summary,
        "chat_template.jinja": _chat_template(x.chatml),
        "profile.yaml": _yaml(x.settings(source)),
    }
    return files


def _yaml(settings: Mapping[str, Any]) -> str:
    import yaml

    body = {k: v for k, v in settings.items() if k != "marker_geometry"}
    text = yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=1 << 20)
    geometry = {"marker_geometry": settings["marker_geometry"]}
    return text + yaml.safe_dump(geometry, sort_keys=False, default_flow_style=None)


def _write_checked(root: Path, files: Mapping[str, str]) -> None:
    """Write the files into a scratch folder, load it as a profile, then move them into place."""
    from hivig.profiles import ProfileError, load_profile

    root.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        for name, text in files.items():
            (scratch / name).write_bytes(text.encode("utf-8"))
        try:
            load_profile(scratch)
        except ProfileError as e:
            raise ReferenceImportError(f"the imported profile does not load: {e}") from None
        root.mkdir(exist_ok=True)
        for name in files:
            os.replace(scratch / name, root / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
