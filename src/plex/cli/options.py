"""The arguments and options several `plex` verbs share.

Each one's flag names and metavar are defined here once, so `-f/--function` or `--input/-i`
cannot drift apart between verbs; its help says what it means for the verb, so the verb passes
it. Only typer is imported: the CLI loads a verb's module (and these) when the verb runs.
"""

from __future__ import annotations

from typing import Any

import typer


def artifact_argument(help: str = "The .mln file.") -> Any:
    return typer.Argument(..., help=help, metavar="ARTIFACT")


def app_toml_argument() -> Any:
    return typer.Argument(
        ...,
        help="The application manifest (app.toml), or a folder that has one.",
        metavar="APP_TOML",
        show_default=False,
    )


def function_option(help: str, default: str | None = "forward") -> Any:
    return typer.Option(default, "-f", "--function", help=help, metavar="NAME")


def inputs_option(help: str) -> Any:
    return typer.Option([], "--input", "-i", help=help, metavar="TENSOR")


def dims_option(help: str) -> Any:
    return typer.Option([], "--dim", help=help, metavar="NAME=N")


def jobs_option(help: str) -> Any:
    return typer.Option(None, "-j", "--jobs", min=1, help=help, metavar="N")


def variant_option(help: str) -> Any:
    return typer.Option(None, "--variant", help=help, metavar="NAME")


def allow_native_code_option() -> Any:
    return typer.Option(
        False,
        "--allow-native-code",
        help="Let the file load its backend plugins (native code that runs in this process as "
        "it loads) although no --trust key signed it. Only for files you trust.",
    )
