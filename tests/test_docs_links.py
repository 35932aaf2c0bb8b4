"""Every path the documentation and the code point to exists in the repository: a newcomer who
follows a link, or opens the file a comment names, finds it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted(
    p
    for p in [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("*/**/README.md")]
    # Hidden folders (a venv, a device-run copy of the tree) are not the repository's docs.
    if not any(part.startswith(".") for part in p.relative_to(REPO).parts)
    and "node_modules" not in p.parts
)
CODE = sorted(
    p
    for top in ("src", "tests", "benchmarks", "tools", "examples")
    for p in (REPO / top).rglob("*.py")
)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_EXTENSIONS = r"(?:py|md|toml|mlir|sh|safetensors|txt|json|lock)"
# A backticked path with a folder and a file name, e.g. `myelin/compiler/phases.py` or
# `tests/plex/test_cli.py::test_x`.
_CODE_SPAN = re.compile(rf"`([\w.-]+(?:/[\w.*-]+)+\.{_EXTENSIONS})(?:::\w+)?`")
# In code: a path from the repository root, e.g. docs/platforms.md.
_ROOTED = re.compile(
    rf"(?<![\w/.])((?:docs|tests|src|benchmarks|examples|tools)/[\w./-]*\.{_EXTENSIONS})\b"
)
# Where a path written in a doc may be relative to: the doc's folder, the root, or a package.
_BASES = ("", "src", "src/myelin", "src/plex", "src/synapse")


# Placeholders in examples: `DIR/trace.json`, `pkg/mod.py` ("module pkg.mod in the package").
_PLACEHOLDER = re.compile(r"(^|/)([A-Z_]+|pkg)/")


def _exists(text: str, doc: Path) -> bool:
    if "*" in text or "<" in text or _PLACEHOLDER.search(text):  # a pattern, not a path
        return True
    candidates = [doc.parent / text] + [REPO / base / text for base in _BASES]
    return any(c.exists() for c in candidates)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_path_in_a_doc_exists(doc):
    text = doc.read_text()
    missing = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        path = target.split("#", 1)[0]
        if path and not (doc.parent / path).exists():
            missing.append(f"link {target}")
    for path in _CODE_SPAN.findall(text):
        if not _exists(path, doc):
            missing.append(f"path `{path}`")
    assert not missing, (
        f"{doc.relative_to(REPO)} points to what is not in the repository: {missing}"
    )


def test_every_repository_path_named_in_code_exists():
    missing = []
    for source in CODE:
        for path in _ROOTED.findall(source.read_text()):
            if "*" not in path and "<" not in path and not (REPO / path).exists():
                missing.append(f"{source.relative_to(REPO)}: {path}")
    assert not missing, missing


def test_nothing_points_outside_the_repository():
    """Notes kept beside the repository do not travel with it: no doc or comment may cite them."""
    outside = re.compile(r"\.\./shared/|notes §|frontends-probe|iree-3\.13-probe|probe notes")
    hits = [
        f"{p.relative_to(REPO)}:{i}"
        for p in [*DOCS, *CODE]
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if outside.search(line) and p != Path(__file__).resolve()
    ]
    assert not hits, hits
