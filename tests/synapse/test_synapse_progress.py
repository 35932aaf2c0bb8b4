import io
import json
import re

import pytest
from rich.console import Console
from synapse_helpers import CompileJob, FailJob, ImportJob

from synapse import (
    BuildFailed,
    Cache,
    Executor,
    JsonProgress,
    Node,
    Output,
    PlainProgress,
    Plan,
    RichProgress,
    make_progress,
)


def two_step(fail=False):
    """import -> compile, as `plex build` of one model shows them; `fail`: the compile fails."""
    source = Output("import:mlp")
    compile_job = (
        FailJob(ValueError("bad flag"), deps=(source,)) if fail else CompileJob("c", (source,))
    )
    return Plan(
        [
            Node("import:mlp", ImportJob("i"), label="import mlp"),
            Node("compile:mlp:cpu", compile_job, heavy=True),
        ]
    )


def plain_lines(stream):
    return [re.sub(r"\d+\.\d+s", "T", line) for line in stream.getvalue().splitlines()]


def test_plain_progress_prints_one_line_per_start_and_finish(tmp_path):
    cache, out = Cache(tmp_path / "cache"), io.StringIO()
    Executor(cache, jobs=1, on_event=PlainProgress(out)).run(two_step())
    assert plain_lines(out) == [
        "plan: 2 nodes, 0 cached, 2 to run",
        "[0/2] start     import:mlp",
        "[1/2] built     import:mlp (T)",
        "[1/2] start     compile:mlp:cpu",
        "[2/2] built     compile:mlp:cpu (T)",
        "ok: 2 built in T",
    ]
    out = io.StringIO()
    Executor(cache, jobs=1, on_event=PlainProgress(out)).run(two_step())
    assert plain_lines(out) == ["plan: 2 nodes, 2 cached, 0 to run", "ok: 2 hit in T"]


def test_plain_progress_reports_failures(tmp_path):
    out = io.StringIO()
    with pytest.raises(BuildFailed):
        Executor(Cache(tmp_path / "c"), jobs=1, on_event=PlainProgress(out)).run(
            two_step(fail=True)
        )
    assert plain_lines(out)[-2:] == [
        "[2/2] FAILED    compile:mlp:cpu: ValueError: bad flag",
        "failed: 1 built, 1 failed in T",
    ]


def test_json_progress_writes_one_event_per_line(tmp_path):
    out = io.StringIO()
    Executor(Cache(tmp_path / "c"), jobs=1, on_event=JsonProgress(out)).run(two_step())
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["kind"], e["node_id"]) for e in events] == [
        ("plan", ""),
        ("start", "import:mlp"),
        ("finish", "import:mlp"),
        ("start", "compile:mlp:cpu"),
        ("finish", "compile:mlp:cpu"),
        ("done", ""),
    ]
    finish = events[4]
    assert finish["status"] == "built" and finish["heavy"] is True and len(finish["key"]) == 64
    assert finish["message"] == "no cache entry (first build)"
    assert (finish["done"], finish["total"], finish["hits"]) == (2, 2, 0)
    assert events[1]["label"] == "import mlp"


def test_rich_progress_shows_running_heavy_nodes_and_a_summary(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    with RichProgress(console=console) as progress:
        Executor(Cache(tmp_path / "c"), jobs=1, on_event=progress).run(two_step())
    frames = out.getvalue()  # every refresh of the live display, then the final lines
    assert re.search(
        r"building 1/2 done, 0 cached\s*\n\s+running compile:mlp:cpu\s+\d+\.\ds", frames
    )
    assert "built compile:mlp:cpu" in frames and "ok: 2 built in" in frames


def test_make_progress_picks_by_mode():
    assert isinstance(make_progress("auto", io.StringIO()), PlainProgress)  # not a terminal
    assert isinstance(make_progress("json", io.StringIO()), JsonProgress)
    assert isinstance(make_progress("rich", io.StringIO()), RichProgress)
    with pytest.raises(ValueError, match="expected one of auto, rich, plain, json"):
        make_progress("fancy", io.StringIO())
