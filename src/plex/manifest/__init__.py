"""Manifests: `plex.toml` (a package) and `app.toml` (an application), read into plain specs.

    app = load_app(Path("app.toml"))     # validate, resolve packages, fill defaults
    write_lock(app)                      # plex.lock next to app.toml

Every problem raises one `plex.errors.ManifestError` whose message is one line,
`file:line: [table] key: problem (hint)`. The specs are frozen dataclasses; the build needs
nothing else from this package. Reference: docs/manifest.md.
"""

from plex.manifest._app import PLEX_PATH, load_app
from plex.manifest._executor import EXECUTOR_FORMS, ExecutorChoice, parse_executor
from plex.manifest._lock import write_lock
from plex.manifest._package import fingerprint_package, load_package
from plex.manifest._planned import NOT_IMPLEMENTED
from plex.manifest._schema import parse_size
from plex.manifest._specs import (
    AppSpec,
    BackendSpec,
    BuildOptions,
    DeviceSpec,
    GraphSpec,
    PackageManifest,
    PackageSpec,
    PlacementRule,
    ShardSpec,
    TuningSpec,
    VariantSpec,
    WeightsSpec,
)

__all__ = [
    "EXECUTOR_FORMS",
    "NOT_IMPLEMENTED",
    "PLEX_PATH",
    "AppSpec",
    "BackendSpec",
    "BuildOptions",
    "DeviceSpec",
    "ExecutorChoice",
    "GraphSpec",
    "PackageManifest",
    "PackageSpec",
    "PlacementRule",
    "ShardSpec",
    "TuningSpec",
    "VariantSpec",
    "WeightsSpec",
    "fingerprint_package",
    "load_app",
    "load_package",
    "parse_executor",
    "parse_size",
    "write_lock",
]
