"""Paths given on the command line: which app manifest a folder or a file names, and output paths
checked before any work starts (a long build or call must not end in "permission denied")."""

from __future__ import annotations

from pathlib import Path

from plex.errors import PlexError

APP_MANIFEST = "app.toml"


def resolve_app(path: Path) -> Path:
    """The app manifest `path` names: a file as given, or `<folder>/app.toml` for a folder.

    One rule for where a build writes by default follows from it: `<app name>.mln` beside the
    app manifest, so `plex build newpkg` and `plex build newpkg/app.toml` write the same file. A
    package manifest (`plex.toml`: a `[package]` table, no `[app]`) is refused with a pointer to
    the app that composes it.
    """
    path = path.expanduser()
    if path.is_dir():
        app = path / APP_MANIFEST
        if not app.is_file():
            hint = (
                f"; it has a package manifest ({path / 'plex.toml'}): write an app.toml that lists "
                "it in [app] packages, or run plex init"
                if (path / "plex.toml").is_file()
                else ""
            )
            raise PlexError(f"{path} is a folder without an {APP_MANIFEST}{hint}")
        return app.resolve()
    if not path.exists():
        raise PlexError(f"{path} does not exist; give an app manifest (app.toml) or its folder")
    if path.suffix != ".toml":
        raise PlexError(
            f"{path} is not an app manifest (a .toml with an [app] table); give the app.toml that "
            "lists its package, or its folder (`plex init NAME` writes a package and an app "
            "around a model)"
        )
    if _is_package_manifest(path):
        beside = path.parent / APP_MANIFEST
        where = (
            f"build the app beside it: plex build {beside}"
            if beside.is_file()
            else "build an app that lists it in [app] packages (plex init writes one)"
        )
        raise PlexError(f"{path} is a package manifest ([package]), not an app; {where}")
    return path.resolve()


def _is_package_manifest(path: Path) -> bool:
    import tomllib

    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False  # the manifest loader words those errors with file and line
    return "package" in data and "app" not in data


def check_writable_file(path: Path, option: str) -> None:
    """Refuse an output file whose folder is missing or not writable, or that is a folder."""
    if path.is_dir():
        raise PlexError(f"{option} {path}: is a folder; give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise PlexError(f"{option} {path}: folder {folder} does not exist")
    _probe(folder, f"{option} {path}")


def check_writable_dir(path: Path, option: str) -> None:
    """Create an output folder (and its parents) or refuse it in one line."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise PlexError(f"{option} {path}: is a file, not a folder") from None
    except OSError as e:
        raise PlexError(f"{option} {path}: cannot create it: {e.strerror}") from None
    _probe(path, f"{option} {path}")


def _probe(folder: Path, what: str) -> None:
    """Create and delete a file in `folder`: the only check that agrees with the later write
    (permission bits do not stop root; read-only mounts and special filesystems do)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".plex-write-check-"):
            pass
    except OSError as e:
        raise PlexError(f"{what}: cannot write in {folder}: {e.strerror}") from None
