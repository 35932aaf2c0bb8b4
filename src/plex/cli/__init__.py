"""The `plex` command line. Each verb lives in its own module; this one wires them together and
turns PLeX/MyeLiN errors into one line and a non-zero exit code (`--debug` shows tracebacks)."""

from __future__ import annotations

import os
import sys

import click
import typer

from myelin.errors import MyelinError
from plex.cli import bench_cmd, build_cmd, cache_cmd, init_cmd, inspect_cmd, run_cmd
from plex.errors import PlexError

app = typer.Typer(
    name="plex",
    help="Build ML models into one .mln artifact and run it with the MyeLiN runtime.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    if debug:
        os.environ["PLEX_DEBUG"] = "1"


app.command("init")(init_cmd.init)
app.command("build")(build_cmd.build)
app.command("inspect")(inspect_cmd.inspect)
app.command("run")(run_cmd.run)
app.command("bench")(bench_cmd.bench)
app.add_typer(cache_cmd.cache_app, name="cache")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("PLEX_DEBUG") == "1"
    try:
        result = app(args=args, prog_name="plex", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("plex: interrupted", file=sys.stderr)
        return 130
    except (PlexError, MyelinError) as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # an unexpected failure is still one line unless --debug
        if debug:
            raise
        print(
            f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 70


if __name__ == "__main__":
    sys.exit(main())
