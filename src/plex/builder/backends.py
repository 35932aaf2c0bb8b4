"""The backend step: an external backend's plugin and the vendor libraries the .mln bundles.

Writes `backend.json` (name, ABI version, ops, the plugin file, the libraries in load order)
beside `plugin.so` and `lib/<name>` copies; the link step turns them into `backend` sections.
"""

from __future__ import annotations

import json
import shutil

from myelin.backends import ABI_VERSION, BackendBuildError, build_plugin
from plex.builder.jobs import BackendJob
from plex.errors import BuildError
from synapse import NodeContext, step

BACKEND_META = "backend.json"
PLUGIN_FILE = "plugin.so"
LIBRARIES_DIR = "lib"


@step(BackendJob)
def run_backend(job: BackendJob, ctx: NodeContext) -> None:
    out = ctx.out_dir
    (out / LIBRARIES_DIR).mkdir()
    libraries = []
    for source, name in zip(job.libraries, job.library_names, strict=True):
        shutil.copyfile(source.path, out / LIBRARIES_DIR / name)
        libraries.append(f"{LIBRARIES_DIR}/{name}")
    if job.library is not None:
        shutil.copyfile(job.library.path, out / PLUGIN_FILE)
        command: list[str] = []
    else:
        try:
            command = build_plugin(
                job.name,
                [s.path for s in job.sources],
                include_dirs=[d.root for d in job.include_dirs],
                libraries=[lib.path for lib in job.libraries],
                static_libraries=[lib.path for lib in job.static_libraries],
                cflags=job.cflags,
                output=out / PLUGIN_FILE,
            )
        except BackendBuildError as e:
            raise BuildError(f"{job.what}: {e}") from e
    meta = {
        "name": job.name,
        "abi": ABI_VERSION,
        "ops": list(job.ops),
        "plugin": PLUGIN_FILE,
        "libraries": libraries,
        "compiler": job.compiler,
        "command": command,
    }
    (out / BACKEND_META).write_text(json.dumps(meta, indent=1))


def read_backend_meta(out_dir) -> dict:
    return json.loads((out_dir / BACKEND_META).read_text())
