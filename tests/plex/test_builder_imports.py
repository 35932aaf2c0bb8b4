"""Planning a build and packing its artifact are light: no IREE compiler, no numpy. A no-op
rebuild is mostly start-up, so what the plan imports is what a user waits for."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.plex.build_helpers import EXAMPLES


def test_planning_a_build_imports_neither_the_compiler_nor_numpy(tmp_path):
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from plex.builder import plan_for\n"
        "import plex.builder.compose, plex.builder.link\n"
        f"app, plan = plan_for(Path({str(EXAMPLES / 'mlp' / 'app.toml')!r}), "
        f"Path({str(tmp_path / 'x.mln')!r}))\n"
        "print(json.dumps([len(plan), sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('numpy', 'iree', 'torch'))]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    nodes, heavy = json.loads(result.stdout.strip().splitlines()[-1])
    assert nodes == 5
    assert heavy == []
