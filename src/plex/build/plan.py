"""From a resolved app to a SYNaPSe plan: which nodes exist, what each one's fingerprint covers.

Node ids:  weights:<pkg>:<name>   import:<pkg>:<graph>   compile:<pkg>:<graph>:<variant>   compose
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from myelin import hostinfo
from myelin.compiler.pipeline import DEFAULT_MIN_PARAMETER_BYTES, compile_flags
from myelin.compiler.targets import TargetDevice
from myelin.frontends import FrontendRequest
from plex.build import steps
from plex.manifest import AppSpec, DeviceSpec, GraphSpec, VariantSpec, WeightsSpec
from synapse import Node, Plan, file_digest, json_digest

# scheduling.favor -> IREE Stream partitioning preference, as a module attribute: the compiler C
# API does not register --iree-stream-partitioning-favor (the iree-compile tool does).
FAVOR_ATTRIBUTES = {
    "min-memory": {},  # IREE's default is min-peak-memory
    "max-concurrency": {"stream.partitioning": '#stream.partitioning_config<"max-concurrency">'},
    "debug": {"stream.partitioning": '#stream.partitioning_config<"debug">'},
}


@dataclass(frozen=True)
class BuildRequest:
    """What the user asked of one build, beyond the manifest."""

    output: Path


def target_device(device: DeviceSpec) -> TargetDevice:
    return TargetDevice(
        name=device.name, target=device.target, cpu=device.cpu,
        cpu_features=device.cpu_features, arch=device.arch,
    )


def device_requirements(device: DeviceSpec) -> dict:
    """What the runtime must find to run code compiled for this device."""
    if device.target == "llvm-cpu" and (device.cpu or "host") == "host":
        return {"cpu_flags": sorted(hostinfo.cpu_flags()), "machine": hostinfo.machine()}
    return {}


def variant_flags(variant: VariantSpec) -> list[str]:
    return compile_flags([target_device(d) for d in variant.devices])


def graph_scope(graph: GraphSpec) -> str:
    """Parameter scope of a graph's inline constants: unique per graph, so two graphs'
    `constant_0` never collide in one artifact."""
    return f"{graph.package}.{graph.name}"


def frontend_request(graph: GraphSpec, scope: str) -> FrontendRequest:
    return FrontendRequest(
        source=graph.source, symbol=graph.source_symbol, module_name=graph.name, scope=scope,
        entrypoints=graph.entrypoints,
    )


def weights_node_id(weights: WeightsSpec) -> str:
    return f"weights:{weights.package}:{weights.name}"


def import_node_id(graph: GraphSpec) -> str:
    return f"import:{graph.package}:{graph.name}"


def compile_node_id(graph: GraphSpec, variant: VariantSpec) -> str:
    return f"compile:{graph.package}:{graph.name}:{variant.name}"


def plan_build(app: AppSpec, request: BuildRequest) -> Plan:
    nodes: list[Node] = []
    weights_seen: dict[str, WeightsSpec] = {}
    for graph in app.graphs:
        if graph.weights is not None and graph.weights.source is not None:
            weights_seen.setdefault(weights_node_id(graph.weights), graph.weights)
    for node_id, weights in weights_seen.items():
        source = weights.source
        assert source is not None
        nodes.append(
            Node(
                id=node_id, kind="weights", label=f"weights {weights.ref}",
                action=lambda ctx, source=source, ref=weights.ref: steps.run_weights(
                    ctx.out_dir, source=source, what=ref
                ),
                inputs={"source": file_digest(source), "format": weights.format or ""},
            )
        )
    compile_ids: list[str] = []
    for graph in app.graphs:
        scope = graph_scope(graph)
        import_id = import_node_id(graph)
        nodes.append(
            Node(
                id=import_id, kind="import", label=f"import {graph.ref}",
                action=lambda ctx, g=graph, scope=scope: steps.run_import(
                    ctx.out_dir, request=frontend_request(g, scope), frontend_name=g.frontend,
                    min_parameter_bytes=DEFAULT_MIN_PARAMETER_BYTES, what=g.ref,
                ),
                inputs={
                    "source": file_digest(graph.source),
                    "frontend": graph.frontend,
                    "options": json_digest(
                        {"module": graph.name, "scope": scope,
                         "min_parameter_bytes": DEFAULT_MIN_PARAMETER_BYTES}
                    ),
                },
                heavy=True,
            )
        )
        for variant in app.variants:
            flags = variant_flags(variant)
            attributes = FAVOR_ATTRIBUTES[app.favor]
            devices = [target_device(d) for d in variant.devices]
            entrypoints = list(graph.entrypoints) if graph.entrypoints is not None else None
            arg_names = {k: list(v) for k, v in graph.arg_names.items()}
            node_id = compile_node_id(graph, variant)
            compile_ids.append(node_id)
            nodes.append(
                Node(
                    id=node_id, kind="compile", label=f"compile {graph.ref} for {variant.name}",
                    deps=(import_id,),
                    action=lambda ctx, d=devices, e=entrypoints, a=arg_names, g=graph,
                    i=import_id, m=attributes, v=variant: steps.run_compile(
                        ctx.out_dir, imported_dir=ctx.dep_outputs[i], devices=d,
                        module_attributes=m, entrypoints=e, arg_names=a,
                        what=f"{g.ref} ({v.name})",
                    ),
                    inputs={
                        "flags": json_digest(flags),
                        "module_attributes": json_digest(attributes),
                        "entrypoints": json_digest(entrypoints),
                        "arg_names": json_digest(arg_names),
                        "requirements": json_digest(
                            [device_requirements(d) for d in variant.devices]
                        ),
                    },
                    heavy=True,
                )
            )
    from plex.build.compose import compose_artifact

    deps = tuple(n.id for n in nodes)
    nodes.append(
        Node(
            id="compose", kind="compose", label=f"compose {request.output.name}",
            deps=deps,
            action=lambda ctx: compose_artifact(app, request, ctx.dep_outputs),
            inputs={"output": json.dumps(str(request.output))},
            cacheable=False,
        )
    )
    return Plan(nodes)
