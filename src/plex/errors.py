"""Error types of the PLeX layer (manifests, resolution, builds).

The CLI turns any of these into one line and a non-zero exit code; `--debug` shows the traceback.
"""

from __future__ import annotations

from pathlib import Path


class PlexError(Exception):
    """Base of every error the PLeX layer raises on purpose."""


class ManifestError(PlexError):
    """A manifest is malformed, names an unknown key, or refers to something that does not exist.

    Carries the file, line and key so the message reads `file:line: [table] key: problem`.
    """

    def __init__(
        self,
        message: str,
        *,
        file: Path | str | None = None,
        line: int | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.file = Path(file) if file is not None else None
        self.line = line
        self.key = key
        self.message = message
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.file is not None:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        key = f"{self.key}: " if self.key else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{key}{self.message}{hint}"


class BuildError(PlexError):
    """A build step failed (import, compile, compose); the message names the graph and step."""


class BuildWarning(UserWarning):
    """A build succeeded but its result may be wrong (e.g. an op IREE is known to miscompute, or
    a weight decode IREE did not fuse). Recorded by the step that found it and raised by every
    build of the artifact, cached or not: a warned-about graph never builds silently."""
