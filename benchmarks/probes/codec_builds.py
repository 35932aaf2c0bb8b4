"""Building an example package with one weight codec for every parameter the rules allow: shared
by benchmarks/probes/codecs_decode.py and benchmarks/probes/codecs_accuracy.py."""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

APP = """\
[app]
name = "{example}-{name}"
packages = ["{package}"]

[devices.cpu]
target = "llvm-cpu"
driver = "local-task"
cpu = "{cpu}"
data_tiling = {data_tiling}
{rule}"""


# As the examples ship: MiniLM with IREE's data tiling, the decoder without.
DATA_TILING = {"minilm": True, "llama": False}


def build_codec(
    example: str, codec: str, folder: Path, cpu: str = "host", prefix: str = ""
) -> Path:
    """`examples/<example>` built with `[weights.codec] "*" = <codec>` (through the normal build
    cache) to `folder/<prefix><codec>.mln`, with the example's own data tiling setting."""
    from plex.builder import build

    name = codec.replace(":", "_")
    app = folder / f"app_{prefix}{name}.toml"
    rule = "" if codec == "fp32" else f'\n[weights.codec]\n"*" = "{codec}"\n'
    package = REPO / "examples" / example
    app.write_text(
        APP.format(
            example=example,
            name=name,
            package=package,
            cpu=cpu,
            rule=rule,
            data_tiling=str(DATA_TILING.get(example, False)).lower(),
        )
    )
    out = folder / f"{prefix}{name}.mln"
    start = time.perf_counter()
    build(app, out)
    print(
        f"built {out.name}: {out.stat().st_size / 2**20:.1f} MiB "
        f"({time.perf_counter() - start:.0f} s)",
        file=sys.stderr,
    )
    return out
