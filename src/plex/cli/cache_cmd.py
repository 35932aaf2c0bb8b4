"""`plex cache ls|gc|clear`: the SYNaPSe build cache."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from plex.cli.build_cmd import _size
from plex.errors import PlexError

cache_app = typer.Typer(
    help="List, trim or clear the build cache.", no_args_is_help=True, rich_markup_mode=None
)

_CACHE_OPT = typer.Option(
    None,
    "--cache",
    help="Cache folder (default: $PLEX_CACHE_DIR, else the user cache folder).",
    metavar="DIR",
)


def _cache(folder: Path | None):
    """The cache to work on, or None when the default one does not exist yet. A folder given
    with --cache must exist: a typo would otherwise show an empty cache without a word."""
    from plex.builder import default_cache_dir
    from synapse import Cache

    if folder is not None:
        if not folder.is_dir():
            raise PlexError(f"--cache {folder}: no such folder (no build has used it as its cache)")
        return Cache(folder)
    root = default_cache_dir()
    if not root.is_dir():
        typer.echo(f"{root}: no cache yet (plex build creates it); 0 entries")
        return None
    return Cache(root)


def ls(cache: Path = _CACHE_OPT) -> None:
    """List cache entries, newest use first."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    c = _cache(cache)
    if c is None:
        return
    entries = sorted(c.ls(), key=lambda e: e.last_used, reverse=True)
    total = _size(sum(e.size for e in entries))
    table = Table(title=escape(f"{c.root}: {len(entries)} entries, {total}"))
    for col in ("key", "node", "size", "last used"):
        table.add_column(col)
    now = time.time()
    for e in entries:
        table.add_row(
            e.key[:16], escape(e.node_id), _size(e.size), f"{(now - e.last_used) / 60:.0f} min ago"
        )
    # Node ids such as memory:llama:decoder:default contain emoji codes (":llama:").
    Console(emoji=False, highlight=False).print(table)


def gc(
    max_size: str = typer.Option(
        None,
        "--max-size",
        help="Keep at most this much, e.g. 2GiB (least recently used go first).",
        metavar="SIZE",
    ),
    older_than_days: float = typer.Option(
        None,
        "--older-than-days",
        min=0,
        help="Drop entries unused for this many days.",
        metavar="DAYS",
    ),
    cache: Path = _CACHE_OPT,
) -> None:
    """Remove least recently used entries."""
    from plex.manifest import parse_size

    max_bytes = None
    if max_size is not None:
        try:
            max_bytes = parse_size(max_size)
        except (ValueError, TypeError) as e:
            raise PlexError(f"--max-size {max_size!r}: {e}") from None
    c = _cache(cache)
    if c is None:
        return
    result = c.gc(
        max_bytes=max_bytes,
        older_than_s=older_than_days * 86400 if older_than_days is not None else None,
    )
    typer.echo(
        f"removed {result.removed} entries ({_size(result.freed_bytes)}); "
        f"kept {result.kept} ({_size(result.kept_bytes)}) in {c.root}"
    )


def clear(cache: Path = _CACHE_OPT) -> None:
    """Remove every entry."""
    c = _cache(cache)
    if c is None:
        return
    typer.echo(f"removed {c.clear()} entries from {c.root}")


COMMANDS = {"ls": ls, "gc": gc, "clear": clear}
