"""Compose: pack what the link step decided into one .mln, and write IR phase files (not cached).

Nothing here decides: the manifest and the list of sections come from the link node, the files
from the nodes that made them. The .mln appears whole at its destination or not at all
(MlnWriter writes a temporary file and renames it).
"""

from __future__ import annotations

import os
import shutil
import warnings

from myelin.mln import ArtifactManifest, MlnWriter
from plex.builder.jobs import ComposeJob, PhasesJob
from plex.builder.link import read_link
from plex.builder.records import PHASES_DIR
from plex.errors import BuildError, BuildWarning
from synapse import NodeContext, step


@step(ComposeJob)
def run_compose(job: ComposeJob, ctx: NodeContext) -> None:
    manifest, sections, recorded = read_link(ctx.output(job.link))
    notes, violations = recorded["notes"], recorded["violations"]
    if violations and job.strict:
        raise BuildError(
            f"{violations[0]}; --strict makes a decode that is not fused an error"
            + (f" ({len(violations) - 1} more)" if len(violations) > 1 else "")
        )
    for message in notes + violations:
        warnings.warn(message, BuildWarning, stacklevel=2)
    # The typed records check every field before anything is written.
    writer = MlnWriter(ArtifactManifest.from_json(manifest))
    for section in sections:
        path = ctx.dep_outputs[section["node"]] / section["file"]
        writer.add_section(section["name"], section["kind"], path)
    job.output.parent.mkdir(parents=True, exist_ok=True)
    writer.write(job.output)


@step(PhasesJob)
def run_phases(job: PhasesJob, ctx: NodeContext) -> None:
    """Copy the IR phase files of every compile node to `target`: `<module>/<variant>/NN.<phase>
    .mlir`, or, for `--compile-to` with one module and variant and a `.mlir` target, that file."""
    files = []  # (from, to)
    for module, variant, compiled in job.compiled:
        folder = ctx.output(compiled) / PHASES_DIR
        for phase_file in sorted(folder.iterdir()):
            files.append((phase_file, job.target / module / variant / phase_file.name))
    if job.single_file:
        if len(files) != 1:
            raise BuildError(
                f"--compile-to writes {len(files)} files (one per module and variant); "
                f"give -o a folder, not {job.target.name}"
            )
        files = [(files[0][0], job.target)]
    for source, destination in files:  # each file appears whole, or not at all
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(f".{destination.name}.partial")
        try:
            shutil.copyfile(source, partial)
            os.replace(partial, destination)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
