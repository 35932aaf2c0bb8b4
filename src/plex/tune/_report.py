"""What `plex tune` shows: a PNG of the search per dispatch and a summary table."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plex.tune._local import TuneResult


def plot(result: TuneResult, path: Path) -> None:
    """Time per trial (relative to the default config, timed in the same round) and the best so
    far, one panel per dispatch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = result.dispatches
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.6 * len(panels)), squeeze=False)
    for ax, d in zip(axes[:, 0], panels, strict=True):
        measured = [t for t in d.trials if t["status"] != "rejected"]
        xs = list(range(1, len(measured) + 1))
        ys = [t.get("relative", float("nan")) for t in measured]
        ax.scatter(xs, ys, s=14, label="trial (ok)")
        failed = [x for x, t in zip(xs, measured, strict=True) if t["status"] != "ok"]
        ax.scatter(failed, [1.0] * len(failed), marker="x", color="red", label="failed/mismatch")
        best, running = [], float("inf")
        for y in ys:
            running = min(running, y) if y == y else running
            best.append(running)
        ax.plot(xs, best, color="green", label="best so far")
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=0.8, label="default")
        ax.set_title(f"{d.dispatch} ({d.share:.0%} of the call)", fontsize=8)
        ax.set_xlabel("trial")
        ax.set_ylabel("time / default")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary(result: TuneResult, app: str, device: str, function: str, dims: Sequence[str]) -> str:
    rows = [
        f"# plex tune: {app} on {device}, {date.today().isoformat()}",
        "",
        f"entrypoint `{function}`" + (f", dims {' '.join(dims)}" if dims else ""),
        "",
        "| dispatch | share | trials (ok/rejected) | best config | time vs default |",
        "|---|---|---|---|---|",
    ]
    for d in result.dispatches:
        ok = sum(1 for t in d.trials if t["status"] == "ok")
        rejected = sum(1 for t in d.trials if t["status"] == "rejected")
        if d.best is None:
            best, rel = "none", "-"
        else:
            c = d.best["config"]
            peel = " peel" if c["peel"] else ""
            best = f"dist {c['dm']}x{c['dn']} vec {c['vm']}x{c['vn']}x{c['vk']}{peel}"
            rel = f"{d.best['relative']:.3f}x" + (" (reused)" if d.reused else "")
        rows.append(f"| {d.dispatch} | {d.share:.0%} | {ok}/{rejected} | {best} | {rel} |")
    if result.layouts:
        rows += [
            "",
            "| weight layout tried | parameters | for dispatch | time vs default layout | kept |",
            "|---|---|---|---|---|",
        ]
        for t in result.layouts:
            rel = f"{t.relative:.3f}x" if t.relative is not None else t.status
            rows.append(
                f"| {t.layout} | {', '.join(t.keys)} | {t.dispatch} | {rel} | "
                f"{'yes' if t.kept else 'no'} |"
            )
    b = result.backend
    if b is not None:
        rel = f"{b.relative:.3f}x the untuned build's time" if b.relative else b.status
        rows += ["", f"backend {b.backend}, every {', '.join(b.ops)} on it: {rel}"]
        if b.faster:
            rows.append(
                f"(faster: a tuning package cannot place ops; to use it, in the app: "
                f"{b.app_lines(result.backend_dir)})"
            )
    rows += [
        "",
        f"whole call, interleaved: untuned {result.untuned_s * 1e3:.3f} ms "
        f"(spread {result.untuned_spread:.0%}), tuned {result.tuned_s * 1e3:.3f} ms "
        f"(spread {result.tuned_spread:.0%}): {result.speedup:.2f}x; outputs "
        + ("equal to the untuned build's" if result.outputs_equal else "DIFFER (do not use)"),
        "",
        _verdict(result),
        "",
        f"package: {result.package.parent}; select it with [myelin] tuning (see plex.toml)"
        if result.applied
        else f"package: {result.package.parent} holds no tuning table: nothing to select",
    ]
    return "\n".join(rows) + "\n"


def _verdict(result: TuneResult) -> str:
    """The package's decision (plex.tune._headroom) in one line."""
    if result.headroom is None:
        return "verdict: not measured"
    return f"verdict: the package {result.headroom.reason()}"
