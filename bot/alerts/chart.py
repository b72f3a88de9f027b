"""The daily summary's chart: each cluster's alive workers over the last day, one small panel each.

People read "fell to zero at 03:10" from a picture faster than from numbers. matplotlib's object API
(`Figure`, no pyplot) keeps no global state, so it is safe in a worker thread; it is imported on the
first chart, not when the bot starts.
"""

from __future__ import annotations

import io
from datetime import datetime

from ops.health import Point


def workers_chart(series: dict[str, tuple[list[Point], int]], start: datetime, end: datetime) -> bytes:
    """A PNG of `series` (cluster -> (its checks, its min_workers)) between `start` and `end` (UTC):
    alive workers as steps, min_workers dashed; a cluster with no checks says so in its panel."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.dates import DateFormatter
    from matplotlib.figure import Figure

    names = list(series) or ["(no clusters)"]
    fig = Figure(figsize=(8, 0.4 + 1.1 * len(names)), dpi=100, layout="constrained")
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names, strict=True):
        points, min_workers = series.get(name, ([], 0))
        if points:
            times = [p.at for p in points] + [end]
            alive = [p.alive for p in points] + [points[-1].alive]
            ax.step(times, alive, where="post", color="tab:blue", linewidth=1.5)
        else:
            ax.text(0.5, 0.5, "no checks", transform=ax.transAxes, ha="center", va="center", color="gray")
        ax.axhline(min_workers, color="tab:red", linestyle="--", linewidth=1)
        top = max([p.alive for p in points] + [min_workers, 1])
        ax.set_ylim(0, top * 1.2 + 0.5)
        ax.set_ylabel(name, rotation=0, ha="right", va="center")
        ax.grid(True, alpha=0.3)
    axes[0].set_xlim(start, end)
    axes[0].set_title(f"alive workers, {start:%Y-%m-%d %H:%M} to {end:%H:%M} UTC (dashed: min)", fontsize=10)
    axes[-1].xaxis.set_major_formatter(DateFormatter("%H:%M"))
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()
