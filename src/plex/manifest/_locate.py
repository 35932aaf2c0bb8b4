"""Map a key path such as ("devices", "cpu", "target") to its line in a TOML file.

tomllib returns values without positions, so this scans the text once and records the line of
every table header, key, and array element. It runs only on text tomllib already accepted, so it
can skip over values without validating them.
"""

from __future__ import annotations

import re
import tomllib

KeyPath = tuple[str | int, ...]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"[^,\]}\n#]*")  # number, boolean or date: runs to a delimiter


class KeyLocator:
    """Line numbers (1-based) of the keys, tables and array elements of one TOML text."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._pos = 0
        self._line = 1
        self.lines: dict[KeyPath, int] = {}
        self.headers: set[KeyPath] = set()  # paths opened by [table] or [[array]] headers
        self._array_index: dict[KeyPath, int] = {}
        self._scan()

    def line_of(self, path: KeyPath) -> int:
        """Line of `path`, else of its nearest enclosing key or table, else 1."""
        for n in range(len(path), 0, -1):
            line = self.lines.get(tuple(path[:n]))
            if line is not None:
                return line
        return 1

    def table_of(self, path: KeyPath) -> KeyPath:
        """The longest proper prefix of `path` that a header in the file opens, or ()."""
        for n in range(len(path) - 1, 0, -1):
            if tuple(path[:n]) in self.headers:
                return tuple(path[:n])
        return ()

    # -- scanner -------------------------------------------------------------------------------

    def _peek(self, n: int = 1) -> str:
        return self._text[self._pos : self._pos + n]

    def _advance(self, n: int = 1) -> None:
        chunk = self._text[self._pos : self._pos + n]
        self._line += chunk.count("\n")
        self._pos += n

    def _skip_blank(self, newlines: bool) -> None:
        """Skip spaces and comments; also newlines when `newlines`."""
        while self._pos < len(self._text):
            c = self._text[self._pos]
            if c in " \t\r" or (newlines and c == "\n"):
                self._advance()
            elif c == "#":
                end = self._text.find("\n", self._pos)
                self._advance((end if end >= 0 else len(self._text)) - self._pos)
            else:
                return

    def _record(self, path: KeyPath, line: int) -> None:
        for n in range(1, len(path) + 1):
            self.lines.setdefault(tuple(path[:n]), line)

    def _scan(self) -> None:
        table: KeyPath = ()
        while True:
            self._skip_blank(newlines=True)
            if self._pos >= len(self._text):
                return
            line = self._line
            if self._peek(2) == "[[":
                self._advance(2)
                array = self._concrete(self._key())
                self._advance(2)  # ]]
                index = self._array_index.get(array, -1) + 1
                self._array_index[array] = index
                table = (*array, index)
                self.headers.add(table)
                self._record(table, line)
                self.lines[table] = line
            elif self._peek() == "[":
                self._advance()
                table = self._concrete(self._key())
                self._advance()  # ]
                self.headers.add(table)
                self._record(table, line)
                self.lines[table] = line
            else:
                self._key_value(table)
            # Whatever remains on the line is a comment or whitespace.
            end = self._text.find("\n", self._pos)
            self._advance((end if end >= 0 else len(self._text)) - self._pos)

    def _concrete(self, keys: list[str]) -> KeyPath:
        """Insert the current element index after every array-of-tables prefix."""
        path: KeyPath = ()
        for i, key in enumerate(keys):
            path = (*path, key)
            if path in self._array_index and i < len(keys) - 1:
                path = (*path, self._array_index[path])
        return path

    def _key(self) -> list[str]:
        parts: list[str] = []
        while True:
            self._skip_blank(newlines=False)
            c = self._peek()
            if c in "\"'":
                parts.append(self._string())
            else:
                m = _BARE_KEY.match(self._text, self._pos)
                end = m.end() if m else self._pos
                parts.append(self._text[self._pos : end])
                self._advance(end - self._pos)
            self._skip_blank(newlines=False)
            if self._peek() != ".":
                return parts
            self._advance()

    def _key_value(self, table: KeyPath) -> None:
        line = self._line
        path = (*table, *self._key())
        self._record(path, line)
        self._skip_blank(newlines=False)
        self._advance()  # =
        self._skip_blank(newlines=False)
        self._value(path)

    def _value(self, path: KeyPath) -> None:
        c = self._peek()
        if c in "\"'":
            self._string()
        elif c == "[":
            self._advance()
            index = 0
            while True:
                self._skip_blank(newlines=True)
                if self._peek() == "]":
                    self._advance()
                    return
                self._record((*path, index), self._line)
                self._value((*path, index))
                index += 1
                self._skip_blank(newlines=True)
                if self._peek() == ",":
                    self._advance()
        elif c == "{":
            self._advance()
            while True:
                self._skip_blank(newlines=False)
                if self._peek() == "}":
                    self._advance()
                    return
                self._key_value(path)
                self._skip_blank(newlines=False)
                if self._peek() == ",":
                    self._advance()
        else:
            m = _SCALAR.match(self._text, self._pos)
            assert m is not None
            self._advance(len(m.group().rstrip()))

    def _string(self) -> str:
        quote = self._peek()
        if self._peek(3) == quote * 3:
            self._advance(3)
            end = self._text.find(quote * 3, self._pos)
            while self._text.startswith(quote, end + 3):  # up to two quotes may end the body
                end += 1
            body = self._text[self._pos : end]
            self._advance(end + 3 - self._pos)
            return body
        self._advance()
        start = self._pos
        while self._pos < len(self._text) and self._text[self._pos] != quote:
            if quote == '"' and self._text[self._pos] == "\\":
                self._advance()
            self._advance()
        raw = self._text[start : self._pos]
        self._advance()
        return raw if quote == "'" else _unescape(raw)


def _unescape(raw: str) -> str:
    # Let tomllib decode escapes, so that a quoted key matches the name tomllib returned.
    return tomllib.loads(f'k = "{raw}"')["k"]
