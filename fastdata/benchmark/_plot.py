"""``--plot``: the per-batch wait distribution and the throughput of every system (PNG).

Left: the CDF of the per-batch waits of the step pass (from the second batch on, as in
the table), log x-axis. Right: samples/s of every system (log scale) with the store
ceiling and the raw LMDB read limit drawn as lines. Drawn from the result dict alone,
so a saved JSON can be plotted again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastdata.errors import ConfigError

__all__ = ["plot"]

_COLORS = {
    "baseline_w0": "#9e9e9e",
    "baseline_w1": "#777777",
    "baseline_w2": "#555555",
    "fastdata_cold": "#1f77b4",
    "fastdata_warm": "#2ca02c",
    "fastdata_hot": "#d62728",
}


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Write the figure of ``result`` to ``path`` (PNG).

    Raises:
        ConfigError: matplotlib is missing (``pip install 'fastdata[bench]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'fastdata[bench]'") from exc
    import numpy as np

    path = Path(path)
    config, systems, limits = result["config"], result["systems"], result["limits"]
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name, s in systems.items():
        waits = np.sort(np.asarray(s["batch_waits_ms"][1:] or s["batch_waits_ms"]))
        if waits.size == 0:
            continue
        # A step up at every wait, starting from zero at the shortest one.
        xs = np.concatenate(([waits[0]], waits))
        ys = np.arange(waits.size + 1) / waits.size
        cdf.step(xs, ys, where="post", label=name, color=_COLORS.get(name), marker=".")
    cdf.set_xscale("log")
    cdf.set_xlabel("wait for the next batch (ms, log scale)")
    cdf.set_ylabel("fraction of batches")
    cdf.set_title(f"per-batch wait with a {config['step_ms']:g} ms training step")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend(loc="lower right", fontsize=8)

    names = list(systems)
    rates = [systems[n]["samples_per_s"] for n in names]
    bars.bar(range(len(names)), rates, color=[_COLORS.get(n, "#444444") for n in names])
    bars.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=8)
    bars.set_yscale("log")
    bars.set_ylabel("samples/s (log scale)")
    bars.set_title("throughput (no training step)")
    per_sample_mb = config["sample_bytes"] / 1e6
    for key, label, style in (
        ("store_get_mb_per_s", "store ceiling", "--"),
        ("lmdb_read_mb_per_s", "raw LMDB read", ":"),
    ):
        bars.axhline(limits[key] / per_sample_mb, linestyle=style, color="black", linewidth=1)
        bars.annotate(
            label,
            (len(names) - 0.5, limits[key] / per_sample_mb),
            ha="right",
            va="bottom",
            fontsize=8,
            color="black",
        )
    for i, rate in enumerate(rates):
        bars.annotate(f"{rate:,.0f}", (i, rate), ha="center", va="bottom", fontsize=8)
    host = result["host"]
    fig.suptitle(
        f"fastdata bench, {config['samples']} x {config['sample_bytes'] // 1024} KiB "
        f"({config['layout']}), batch {config['batch_size']}; {result['date']}; "
        f"{host['cpu']}, {host['cores']} cores",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
