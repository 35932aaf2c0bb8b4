"""The `plex` command line. Each verb lives in its own module; this one wires them together and
turns PLeX/MyeLiN errors into one line and a non-zero exit code (`--debug` shows tracebacks).

Start-up is part of the interface: `plex --help` must answer at once. So every verb module
imports only the standard library and typer at its top; numpy, pydantic, rich, the IREE
bindings and the build machinery are imported inside the verb's function, when it runs
(`tests/plex/test_cli_help.py` checks what `plex --help` loads). Help is rendered as plain
text (`rich_markup_mode=None`): help strings show `[build] jobs` as written, and flags carry no
type placeholder.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import typer

from plex.cli import (
    accuracy_cmd,
    bench_cmd,
    build_cmd,
    cache_cmd,
    generate_cmd,
    init_cmd,
    inspect_cmd,
    profile_cmd,
    run_cmd,
    sign_cmd,
    tune_cmd,
)

EXIT_ERROR = 1
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130

app = typer.Typer(
    name="plex",
    help="Build ML models into one .mln artifact and run it with the MyeLiN runtime.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _debug() -> bool:
    return os.environ.get("PLEX_DEBUG") == "1"


def show_warning_line(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A warning as one `warning: ...` line, like errors: Python's default names the file and
    line that called warnings.warn and repeats that source line, which tells a user nothing.
    PLeX's own warnings (a build's notes) are the message alone; others keep their category."""
    from plex.errors import BuildWarning

    text = str(message) if issubclass(category, BuildWarning) else f"{category.__name__}: {message}"
    with contextlib.suppress(OSError):  # stderr gone: a warning is not worth failing for
        print(f"warning: {text}", file=file or sys.stderr, flush=True)


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Errors meant for people become `error: ...` and exit 1; anything else is an internal
    error, still one line unless --debug. Warnings print as `warning: ...` lines (unless
    --debug)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from myelin.errors import MyelinError
        from plex.errors import PlexError

        try:
            with warnings.catch_warnings():
                if not _debug():
                    warnings.showwarning = show_warning_line
                return command(*args, **kwargs)
        except typer.Exit:
            raise
        except KeyboardInterrupt:
            print("plex: interrupted", file=sys.stderr)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except (PlexError, MyelinError) as e:
            if _debug():
                raise
            print(f"error: {_printable(str(e))}", file=sys.stderr)
            raise typer.Exit(EXIT_ERROR) from None
        except Exception as e:
            if _debug():
                raise
            print(
                f"internal error: {type(e).__name__}: {_printable(str(e))} "
                "(run with --debug for the traceback)",
                file=sys.stderr,
            )
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper


def _printable(message: str) -> str:
    """A message naming things from a file, as the terminal may show it: escape sequences and
    lone surrogates escaped line by line (a multi-line compiler diagnostic keeps its lines)."""
    from myelin.untrusted import printable

    return "\n".join(printable(line) for line in message.split("\n"))


def version_text() -> str:
    """`plex 0.1.0 (IREE compiler 3.13.0, runtime 3.13.0; Python 3.11.9)`: the versions that
    decide what a build produces, read from the installed distributions (nothing imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    python = ".".join(map(str, sys.version_info[:3]))
    return (
        f"plex {installed('plex')} (IREE compiler {installed('iree-base-compiler')}, "
        f"runtime {installed('iree-base-runtime')}; Python {python})"
    )


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
    version: bool = typer.Option(
        False,
        "--version",
        help="Print the versions of plex and IREE and exit.",
        callback=_print_version,
        is_eager=True,
    ),
) -> None:
    if debug:
        os.environ["PLEX_DEBUG"] = "1"


for name, command in (
    ("init", init_cmd.init),
    ("build", build_cmd.build),
    ("inspect", inspect_cmd.inspect),
    ("run", run_cmd.run),
    ("generate", generate_cmd.generate),
    ("bench", bench_cmd.bench),
    ("accuracy", accuracy_cmd.accuracy),
    ("profile", profile_cmd.profile),
    ("tune", tune_cmd.tune),
    ("keygen", sign_cmd.keygen),
    ("sign", sign_cmd.sign),
    ("verify", sign_cmd.verify),
):
    app.command(name)(one_line_errors(command))
for name, command in cache_cmd.COMMANDS.items():
    cache_cmd.cache_app.command(name)(one_line_errors(command))
app.add_typer(cache_cmd.cache_app, name="cache")


def main() -> None:
    app(prog_name="plex")


if __name__ == "__main__":
    main()
