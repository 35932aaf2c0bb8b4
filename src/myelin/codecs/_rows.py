"""A .mln's parameters per logical parameter and bytes per codec, for reports (`plex inspect`,
`plex build`, `plex accuracy`): reads the manifest's parameter records, nothing else."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParameterRow:
    """One logical parameter of a .mln, its stored parts summed (for reports)."""

    scope: str
    key: str
    codec: str
    dtype: str  # logical
    shape: tuple[int, ...]  # logical
    stored_bytes: int
    rule: str  # why it has this codec ("" when the build applied no codec policy)
    offset: int  # of its data part, relative to its section


def parameter_rows(parameters: list[dict]) -> list[ParameterRow]:
    """The `parameters` of a .mln manifest grouped by logical parameter: a scale or zero part
    (`of`) adds its bytes to the parameter it belongs to."""
    rows: dict[tuple[str, str], dict] = {}
    extra: dict[tuple[str, str], int] = {}
    for p in parameters:
        if "of" in p:
            key = (p["scope"], p["of"])
            extra[key] = extra.get(key, 0) + p["length"]
        else:
            rows[(p["scope"], p["key"])] = p
    return [
        ParameterRow(
            p["scope"],
            p["key"],
            p["codec"],
            p["dtype"],
            tuple(p["shape"]),
            p["length"] + extra.get(k, 0),
            p.get("rule", ""),
            p["offset"],
        )
        for k, p in rows.items()
    ]


def bytes_by_codec(parameters: list[dict]) -> dict[str, tuple[int, int]]:
    """codec -> (stored bytes, number of parameters), largest first."""
    totals: dict[str, list[int]] = {}
    for row in parameter_rows(parameters):
        t = totals.setdefault(row.codec, [0, 0])
        t[0] += row.stored_bytes
        t[1] += 1
    return {c: (b, n) for c, (b, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])}
