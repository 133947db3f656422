"""Python-call parsing shared by the ScaleCUA and OSWorld parsers: ``ast`` only, never ``eval``."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from hivig.actions.model import ActionError

REQUIRED: Any = object()
"""Sentinel default for a parameter that must be given."""

Signature = tuple[tuple[str, Any], ...]
"""Ordered (parameter, default) pairs; positional arguments bind in this order."""

# Anything ``ast`` can throw on hostile text: syntax, NUL bytes, nesting depth, size.
_AST_ERRORS = (SyntaxError, ValueError, TypeError, RecursionError, MemoryError)


@dataclass(frozen=True)
class RawCall:
    """One call of an action block, bound to its signature (defaults filled in).

    Attributes:
        name: Canonical call name (aliases resolved, e.g. ``left_click`` -> ``click``).
        kwargs: Bound arguments by parameter name, literal values as written.
        alias: The alias written in the source, if one was used.
        positional: Whether any argument was passed positionally.
        line: The source line, for error messages and quarantine files.
    """

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    alias: str | None = None
    positional: bool = False
    line: str = ""


def literal(node: ast.expr, line: str) -> Any:
    """Evaluate one argument node as a Python literal, or return an ActionError."""
    try:
        return ast.literal_eval(node)
    except _AST_ERRORS:
        return ActionError("bad_argument", f"argument is not a literal in {line!r}")


def split_call(node: ast.Call, line: str) -> tuple[list[Any], dict[str, Any]] | ActionError:
    """Literal positional and keyword arguments of a call node."""
    args: list[Any] = []
    for arg in node.args:
        if isinstance(arg, ast.Starred):
            return ActionError("bad_syntax", f"starred argument in {line!r}")
        value = literal(arg, line)
        if isinstance(value, ActionError):
            return value
        args.append(value)
    kwargs: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return ActionError("bad_syntax", f"'**' argument in {line!r}")
        if kw.arg in kwargs:
            return ActionError("bad_argument", f"repeated argument {kw.arg!r} in {line!r}")
        value = literal(kw.value, line)
        if isinstance(value, ActionError):
            return value
        kwargs[kw.arg] = value
    return args, kwargs


def parse_expression(line: str) -> ast.expr | ActionError:
    """Parse one line in expression mode."""
    try:
        return ast.parse(line, mode="eval").body
    except _AST_ERRORS as exc:
        return ActionError("bad_syntax", f"cannot parse {line!r} ({type(exc).__name__})")


def parse_module(code: str) -> list[ast.stmt] | ActionError:
    """Parse a block of statements."""
    try:
        return ast.parse(code, mode="exec").body
    except _AST_ERRORS as exc:
        return ActionError("bad_syntax", f"cannot parse code ({type(exc).__name__})")


def bind(
    name: str,
    signature: Signature,
    args: list[Any],
    kwargs: dict[str, Any],
    line: str,
    ignore: frozenset[str] = frozenset(),
) -> dict[str, Any] | ActionError:
    """Bind positional then keyword arguments to ``signature``; fill defaults.

    Args:
        name: Call name, for messages.
        signature: Ordered (parameter, default) pairs.
        args: Positional values.
        kwargs: Keyword values.
        line: Source line, for messages.
        ignore: Keyword parameters accepted and dropped (pyautogui timing arguments).

    Returns:
        Bound arguments, or ``bad_argument`` / ``missing_argument``.
    """
    params = [p for p, _d in signature]
    if len(args) > len(params):
        return ActionError("bad_argument", f"{name} takes {len(params)} positional: {line!r}")
    bound = dict(zip(params, args, strict=False))
    for key, value in kwargs.items():
        if key in ignore:
            continue
        if key not in params:
            return ActionError("bad_argument", f"{name} has no argument {key!r}: {line!r}")
        if key in bound:
            return ActionError("bad_argument", f"{name} got {key!r} twice: {line!r}")
        bound[key] = value
    for param, default in signature:
        if param not in bound:
            if default is REQUIRED:
                return ActionError("missing_argument", f"{name} needs {param!r}: {line!r}")
            bound[param] = default
    return bound
