"""A TOML manifest being read: its text, its data, and errors that point at its lines.

Every problem found in a manifest becomes one `ManifestError` built here, so that all of them
read `file:line: [table] key: problem (hint)`.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from plex.errors import ManifestError
from plex.manifest._locate import KeyLocator, KeyPath

M = TypeVar("M", bound=BaseModel)

_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$|\s*\(at end of document\)$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


# Deeper values are refused on read: no manifest key takes them, and the checks that walk a
# value (the schema, error locations) would otherwise recurse as deep as the file says.
MAX_NESTING = 32


def _depth(value: Any) -> int:
    """How deeply arrays and tables nest in `value` (iteratively: the file chooses the depth)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


@dataclass
class TomlDocument:
    path: Path
    text: str
    data: dict[str, Any]
    locator: KeyLocator
    # A package's files must lie inside its folder unless the app opts in
    # (`[app] allow_outside_sources`); the package reader sets this from the app.
    allow_outside_sources: bool = False

    @classmethod
    def read(cls, path: Path) -> TomlDocument:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ManifestError("file not found", file=path) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ManifestError(f"cannot read: {e}", file=path) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise _syntax_error(path, text, str(e)) from None
        except RecursionError:  # tomllib parses nested arrays and inline tables recursively
            data = None
        if data is None or _depth(data) > MAX_NESTING:
            raise ManifestError(
                f"values nest more than {MAX_NESTING} levels deep; a manifest needs a few",
                file=path,
            )
        return cls(path, text, data, KeyLocator(text))

    def error(self, path: KeyPath, message: str, hint: str | None = None) -> ManifestError:
        """An error about the key at `path`, pointing at its line in the file."""
        return ManifestError(
            message,
            file=self.path,
            line=self.locator.line_of(path),
            key=self.show_key(path),
            hint=hint,
        )

    def show_key(self, path: KeyPath) -> str:
        """`[devices.cpu] target`, `[[variant]] devices[1]`, `[devices.cpu]`, or `app`."""
        table = path if path in self.locator.headers else self.locator.table_of(path)
        rest = path[len(table) :]
        shown = _join(rest)
        if not table:
            return shown
        array = isinstance(table[-1], int)  # an element of [[array]]
        header = f"[[{_join(table[:-1])}]]" if array else f"[{_join(table)}]"
        return f"{header} {shown}" if shown else header

    def validate(self, model: type[M]) -> M:
        """The data as `model`, or the first problem (by line) as a ManifestError.

        A missing key is reported last: it is often the consequence of a misspelt one.
        """
        try:
            return model.model_validate(self.data)
        except ValidationError as e:
            problems = [
                (err["type"] == "missing", self._translate(model, err)) for err in e.errors()
            ]
            _, first = min(problems, key=lambda p: (p[0], p[1].line or 0))
            raise first from None

    def _translate(self, model: type[BaseModel], err: Any) -> ManifestError:
        loc: KeyPath = tuple(err["loc"])
        kind: str = err["type"]
        value = err.get("input")
        ctx = err.get("ctx") or {}
        if kind == "extra_forbidden":
            accepted = sorted(_fields(_annotation_at(model, loc[:-1])))
            return self.error(loc, *unknown(str(loc[-1]), accepted, what="key"))
        if kind == "missing":
            if _is_model(_annotation_at(model, loc)):
                return self.error(loc, "missing required table", f"add [{_join(loc)}]")
            return self.error(loc, "missing required key")
        if kind == "literal_error":
            accepted = list(typing.get_args(_strip_optional(_annotation_at(model, loc))))
            return self.error(loc, *unknown(value, accepted, what="value"))
        if kind == "string_pattern_mismatch":
            return self.error(loc, f"invalid value {value!r}; must match {ctx['pattern']}")
        if kind in ("greater_than_equal", "greater_than"):
            op = ">=" if kind == "greater_than_equal" else ">"
            bound = ctx.get("ge", ctx.get("gt"))
            return self.error(loc, f"must be {op} {bound}, got {value!r}")
        if kind == "too_short":
            return self.error(loc, "must not be empty")
        if kind == "value_error":
            return self.error(loc, str(ctx.get("error", err["msg"])))
        expected = _EXPECTED.get(kind)
        if expected:
            return self.error(loc, f"expected {expected}, got {describe(value)}")
        return self.error(loc, err["msg"])


def unknown(value: object, accepted: Iterable[str], *, what: str) -> tuple[str, str]:
    """Message and hint for a name that is not one of `accepted`, with a did-you-mean."""
    accepted = list(accepted)
    message = f"unknown {what}" if what == "key" else f"unknown {what} {value!r}"
    close = difflib.get_close_matches(str(value), accepted, n=1) if isinstance(value, str) else []
    if close:
        message += f"; did you mean {close[0]!r}?"
    hint = f"accepted: {', '.join(accepted)}" if accepted else "none is declared"
    return message, hint


def describe(value: object) -> str:
    """A TOML value as a person would name it: `a string 'two'`, `a table`, ..."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"a string {value!r}"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a float ({value})"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"


_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_type": "true or false",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def _syntax_error(path: Path, text: str, message: str) -> ManifestError:
    m = _TOML_POSITION.search(message)
    line = column = None
    if m and m.group(1):
        line, column = int(m.group(1)), int(m.group(2))
    elif m:  # at end of document
        line = text.count("\n") + (0 if text.endswith("\n") else 1)
    detail = _TOML_POSITION.sub("", message)
    where = f" at column {column}" if column else " at end of file"
    return ManifestError(f"invalid TOML: {detail}{where}", file=path, line=max(line or 1, 1))


def _join(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = part if _BARE_KEY.match(part) else f'"{part}"'
            out += f".{key}" if out else key
    return out


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        arms = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _strip_optional(arms[0]) if arms else annotation
    if typing.get_origin(annotation) is typing.Annotated:
        return _strip_optional(typing.get_args(annotation)[0])
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _fields(annotation: Any) -> list[str]:
    return list(annotation.model_fields) if _is_model(annotation) else []


def _annotation_at(model: type[BaseModel], loc: KeyPath) -> Any:
    """The type annotation that validates the value at `loc` inside `model`."""
    annotation: Any = model
    for part in loc:
        annotation = _strip_optional(annotation)
        origin = typing.get_origin(annotation)
        if _is_model(annotation):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return None
            annotation = field.annotation
        elif origin is dict:
            annotation = typing.get_args(annotation)[1]
        elif origin in (list, tuple):
            annotation = typing.get_args(annotation)[0]
        else:
            return None
    return _strip_optional(annotation)
