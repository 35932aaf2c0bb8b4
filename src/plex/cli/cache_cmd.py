"""`plex cache ls|gc|clear`: the SYNaPSe build cache."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from plex.cli.build_cmd import _size
from plex.manifest import parse_size

cache_app = typer.Typer(help="List, trim or clear the build cache.", no_args_is_help=True)

_CACHE_OPT = typer.Option(
    None, "--cache", help="Cache folder (default: $PLEX_CACHE_DIR, else the user cache folder)."
)


def _cache(folder: Path | None):
    from plex.builder import default_cache_dir
    from synapse import Cache

    return Cache(folder or default_cache_dir())


def ls(cache: Path = _CACHE_OPT) -> None:
    """List cache entries, newest use first."""
    c = _cache(cache)
    entries = sorted(c.ls(), key=lambda e: e.last_used, reverse=True)
    table = Table(title=f"{c.root}: {len(entries)} entries, {_size(sum(e.size for e in entries))}")
    for col in ("key", "node", "size", "last used"):
        table.add_column(col)
    now = time.time()
    for e in entries:
        table.add_row(
            e.key[:16], e.node_id, _size(e.size), f"{(now - e.last_used) / 60:.0f} min ago"
        )
    Console().print(table)


def gc(
    max_size: str = typer.Option(
        None, "--max-size", help="Keep at most this much, e.g. 2GiB (least recently used go first)."
    ),
    older_than_days: float = typer.Option(
        None, "--older-than-days", help="Drop entries unused for this many days."
    ),
    cache: Path = _CACHE_OPT,
) -> None:
    """Remove least recently used entries."""
    c = _cache(cache)
    result = c.gc(
        max_bytes=parse_size(max_size) if max_size else None,
        older_than_s=older_than_days * 86400 if older_than_days is not None else None,
    )
    typer.echo(f"removed {result}")


def clear(cache: Path = _CACHE_OPT) -> None:
    """Remove every entry."""
    typer.echo(f"removed {_cache(cache).clear()} entries")


COMMANDS = {"ls": ls, "gc": gc, "clear": clear}
