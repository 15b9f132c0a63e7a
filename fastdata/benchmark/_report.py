"""The report: one JSON-ready dict, the printed table, the targets, and the plot.

The JSON shape is the one of issue 8, with more keys beside it::

    {"config": {...}, "host": {...}, "date": ..., "open_s": ...,
     "limits": {"store_get_mb_per_s", "lmdb_read_mb_per_s", "memcpy_gb_per_s",
                "fresh_pages": {"page_cache" | "anon_first" | "anon_again": {...}},
                "get_latency_ms": {"p50", "p99", ...}, ...},
     "systems": {"baseline_w0" | "baseline_w2" | "fastdata_cold" | "fastdata_warm" |
                 "fastdata_hot": {"samples", "samples_per_s", "mb_per_s", "ttfb_s",
                                  "batch_wait_ms": {"p50", "p90", "p99", "max"},
                                  "stall_fraction", "cpu_ms_per_sample", ...}},
     "ratios": {...}, "targets": [...], "summary": "data-loading latency ..."}
"""

from __future__ import annotations

import time
from typing import Any

from fastdata.benchmark._config import BenchConfig
from fastdata.benchmark._limits import new_page_share
from fastdata.benchmark._measure import cpu_per_sample_ms, percentiles
from fastdata.benchmark._systems import SystemRun

__all__ = ["SYSTEMS", "build_result", "cpu_line", "print_report", "summary_line"]

SYSTEMS = ("baseline_w0", "baseline_w2", "fastdata_cold", "fastdata_warm", "fastdata_hot")
_LABELS = {
    "baseline_w0": "baseline w0",
    "baseline_w1": "baseline w1",
    "baseline_w2": "baseline w2",
    "fastdata_cold": "fastdata cold",
    "fastdata_warm": "fastdata warm",
    "fastdata_hot": "fastdata hot",
}
_LEGEND = (
    "baseline wN: torch DataLoader over a map-style dataset, one s3fs GET per sample, "
    "N worker processes; cold: empty cache; warm: LMDB tier only, page cache dropped; "
    "hot: RAM tier. Waits: per batch, with the training step, from the 2nd batch on."
)
_MIN_WIDTH = 132
#: Which limit each fastdata system is compared with, and the key of its MB/s.
_LIMIT_OF = {
    "fastdata_cold": ("store ceiling", "store_get_mb_per_s"),
    "fastdata_warm": ("raw LMDB read", "lmdb_read_mb_per_s"),
    "fastdata_hot": ("memcpy", "memcpy_mb_per_s"),
}


def _system_dict(config: BenchConfig, run: SystemRun) -> dict[str, Any]:
    tp, step = run.throughput, run.step
    out: dict[str, Any] = {
        "samples": tp.samples,
        "samples_per_s": tp.samples / tp.seconds if tp.seconds > 0 else 0.0,
        "mb_per_s": tp.samples * config.sample_bytes / tp.seconds / 1e6 if tp.seconds else 0.0,
        "ttfb_s": tp.ttfb_s,
        "batch_wait_ms": percentiles(step.steady_waits_s),
        "stall_fraction": step.stall_fraction,
        "stall_fraction_steady": step.steady_stall_fraction,
        "seconds": tp.seconds,
        "batches": tp.batches,
        "batch_wait_nostep_ms": percentiles(tp.steady_waits_s),
        "step_pass": {
            "batches": step.batches,
            "samples": step.samples,
            "seconds": step.seconds,
            "ttfb_s": step.ttfb_s,
            "step_ms": step.step_s * 1000,
        },
        "batch_waits_ms": [w * 1000 for w in step.waits_s],
        # The throughput pass's CPU (NOTE[bench-pass]); server: None unless embedded.
        "cpu_ms_per_sample": {
            "client": cpu_per_sample_ms(tp.cpu_s, tp.samples),
            "server": cpu_per_sample_ms(tp.server_cpu_s, tp.samples),
        },
    }
    if run.open_s:
        out["open_s"] = run.open_s
    if run.store_samples >= 0:
        out["store_samples"] = run.store_samples
    out.update(run.extra)
    return out


def build_result(
    config: BenchConfig,
    *,
    host: dict[str, Any],
    endpoint: str,
    upload_s: float,
    total_s: float,
    open_s: float,
    limits: dict[str, Any],
    systems: dict[str, SystemRun],
    workers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything a run measured, with ratios, targets and the summary line."""
    limits = dict(limits)
    limits["memcpy_mb_per_s"] = limits["memcpy_gb_per_s"] * 1000
    result: dict[str, Any] = {
        "config": {**config.as_dict(), "endpoint": endpoint, "step": "time.sleep"},
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": host,
        "open_s": open_s,
        "upload_s": upload_s,
        "total_s": total_s,
        "limits": limits,
        "systems": {name: _system_dict(config, run) for name, run in systems.items()},
    }
    if workers is not None:
        result["workers"] = workers
    result["ratios"] = _ratios(result)
    result["targets"] = _targets(config, result)
    result["summary"] = summary_line(result)
    return result


def _limit_of(name: str, limits: dict[str, Any]) -> tuple[str, str]:
    """The limit ``name`` is compared with: over packed shards, cold's is the 8 MiB-range
    ceiling (what reading shards as shards can reach), not the per-sample one."""
    if name == "fastdata_cold" and "range_get_mb_per_s" in limits:
        return ("8 MiB-range ceiling", "range_get_mb_per_s")
    return _LIMIT_OF[name]


def _ratios(result: dict[str, Any]) -> dict[str, float]:
    systems, limits = result["systems"], result["limits"]
    base = systems["baseline_w2"]["samples_per_s"]
    out: dict[str, float] = {}
    for name, figures in systems.items():
        if name != "baseline_w2" and base > 0:
            out[f"{name}_vs_baseline_w2"] = figures["samples_per_s"] / base
        if name in _LIMIT_OF:
            limit = limits[_limit_of(name, limits)[1]]
            out[f"{name}_vs_limit"] = figures["mb_per_s"] / limit if limit > 0 else 0.0
    if "fastdata_cold" in systems and limits.get("store_get_mb_per_s", 0) > 0:
        cold = systems["fastdata_cold"]["mb_per_s"]
        out["fastdata_cold_vs_store_ceiling"] = cold / limits["store_get_mb_per_s"]
        if limits.get("raw_get_mb_per_s", 0) > 0:
            out["fastdata_cold_vs_raw_get_ceiling"] = cold / limits["raw_get_mb_per_s"]
    return out


def _targets(config: BenchConfig, result: dict[str, Any]) -> list[dict[str, Any]]:
    systems, ratios = result["systems"], result["ratios"]
    warm, cold = systems["fastdata_warm"], systems["fastdata_cold"]
    # A --quick run is too small for its throughput ratios to mean anything (fixed costs
    # dominate a few batches), and the latency target is stated for 256 x 100 KiB
    # batches and a 20 ms step.
    sized = not config.quick
    headline = sized and (config.batch_size, config.sample_bytes, config.step_ms) == (
        256,
        102400,
        20.0,
    )
    cold_limit = _limit_of("fastdata_cold", result["limits"])
    # (target, value, bound, comparison, applies, the system it measures and what its
    # CPU is set against in the cause of a miss: a system, "ceiling" or None)
    rows = [
        (
            "warm >= 0.8x raw LMDB read",
            ratios["fastdata_warm_vs_limit"],
            0.8,
            ">=",
            sized,
            "fastdata_warm",
            None,
        ),
        (
            f"cold >= 0.8x {cold_limit[0]}",
            ratios["fastdata_cold_vs_limit"],
            0.8,
            ">=",
            sized,
            "fastdata_cold",
            "ceiling" if cold_limit[1] == "store_get_mb_per_s" else None,
        ),
        (
            "warm p99 batch wait <= 1 ms",
            warm["batch_wait_ms"]["p99"],
            1.0,
            "<=",
            headline,
            None,
            None,
        ),
        ("warm stall fraction < 1%", warm["stall_fraction"], 0.01, "<", headline, None, None),
        (
            "warm >= 10x baseline w2",
            ratios["fastdata_warm_vs_baseline_w2"],
            10.0,
            ">=",
            sized,
            "fastdata_warm",
            "baseline_w2",
        ),
        (
            "cold >= 10x baseline w2",
            ratios["fastdata_cold_vs_baseline_w2"],
            10.0,
            ">=",
            sized,
            "fastdata_cold",
            "baseline_w2",
        ),
        ("cold time to first batch <= 0.5 s", cold["ttfb_s"], 0.5, "<=", True, None, None),
    ]
    out = []
    for name, value, bound, op, applies, system, against in rows:
        met = {">=": value >= bound, "<=": value <= bound, "<": value < bound}[op]
        cause = (
            None if met or not applies or system is None else miss_cause(result, system, against)
        )
        out.append(
            {
                "target": name,
                "value": value,
                "bound": bound,
                "met": met,
                "applies": applies,
                "cause": cause,
            }
        )
    return out


def miss_cause(result: dict[str, Any], system: str, against: str | None) -> str | None:
    """The measured cause of a missed throughput target: the cores the client and the
    server kept busy over the system's throughput pass (near the host's cores, the pass
    is CPU-bound and its CPU per sample is what it lacks), and that CPU per sample
    against ``against``'s (a system, or ``"ceiling"``: the per-sample store ceiling)."""
    figures = result["systems"].get(system, {})
    cpu = figures.get("cpu_ms_per_sample") or {}
    client, server = cpu.get("client"), cpu.get("server")
    if client is None:
        return None
    rate = float(figures.get("samples_per_s", 0.0))
    busy_client = client * rate / 1000
    busy_server = None if server is None else server * rate / 1000
    busy = busy_client + (busy_server or 0.0)
    cores = result.get("host", {}).get("cores")
    if cores:
        bound = "CPU-bound" if busy >= 0.85 * cores else "not CPU-bound"
        of = f"{cores} cores busy ({bound})"
    else:
        of = "? cores busy (the host's cores are unknown)"
    server_text = "-" if busy_server is None else f"{busy_server:.2f}"
    text = (
        f"cause: client {busy_client:.2f} + server {server_text} = {busy:.2f} of {of}; "
        f"client CPU {client:.3f} ms per sample"
    )
    if against == "ceiling":
        base = (result["limits"].get("store_cpu_ms_per_sample") or {}).get("client")
        label = "the store ceiling"
    elif against is not None:
        base = (result["systems"].get(against, {}).get("cpu_ms_per_sample") or {}).get("client")
        label = _LABELS.get(against, against)
    else:
        base = None
    if base:
        text += f" against {base:.3f} for {label} ({client / base:.2f}x)"
    page = (result["limits"].get("fresh_pages") or {}).get("page_cache")
    if page is not None and system == "fastdata_cold" and client > 0:
        # Only the cold pass caches; its baselines (s3fs, the store ceiling) cache nothing.
        per_mb = client / (result["config"]["sample_bytes"] / 1e6)
        text += "; " + new_page_share(page, per_mb)
    return text


def summary_line(result: dict[str, Any]) -> str:
    """The plain comparison: the baseline's median batch wait against warm's.

    The median of the 0-worker baseline is its typical wait; with 2 workers the waits
    alternate between near zero and a whole batch (the workers finish batches in
    pairs), so its median says little and the mean is given beside it.
    """
    config, systems = result["config"], result["systems"]
    base0 = systems["baseline_w0"]["batch_wait_ms"]
    base2 = systems["baseline_w2"]["batch_wait_ms"]
    warm = systems["fastdata_warm"]["batch_wait_ms"]
    batch = f"{config['batch_size']} x {_size(config['sample_bytes'])}"
    return (
        f"data-loading latency {base0['p50']:,.0f} ms -> {warm['p50']:.2f} ms "
        f"({base0['p50'] / max(warm['p50'], 1e-6):,.0f}x): median wait per batch of "
        f"{batch} with a {config['step_ms']:g} ms training step, torch DataLoader + s3fs "
        f"(num_workers=0) vs fastdata warm (LMDB, page cache dropped). With num_workers=2 "
        f"the baseline's median is {_ms(base2['p50'])} ms and its mean {_ms(base2['mean'])} ms "
        f"(its two workers deliver batches in pairs); fastdata warm's mean is "
        f"{_ms(warm['mean'])} ms ({_compare(base2['mean'], warm['mean'])})."
    )


def _compare(baseline: float, ours: float) -> str:
    """``"46x less"``, or ``"1.4x more"`` when fastdata waited longer (a --quick run, where
    the baseline's workers read the few batches ahead while they started)."""
    if ours <= 0 or baseline >= ours:
        ratio = baseline / max(ours, 1e-6)
        return f"{ratio:,.0f}x less" if ratio >= 10 else f"{ratio:.1f}x less"
    ratio = ours / max(baseline, 1e-6)
    return f"{ratio:,.0f}x more" if ratio >= 10 else f"{ratio:.1f}x more"


def _size(nbytes: int) -> str:
    if nbytes % 1024 == 0:
        return f"{nbytes // 1024} KiB"
    return f"{nbytes} B"


def print_report(result: dict[str, Any], console: Any = None) -> None:
    """Print the systems table, the limits, the targets and the summary with rich."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        console = Console()
        console = Console(width=max(console.width, _MIN_WIDTH))
    config, limits = result["config"], result["limits"]
    table = Table(
        title=(
            f"fastdata bench: {config['samples']} x {_size(config['sample_bytes'])} "
            f"({config['layout']}), batch {config['batch_size']}, step {config['step_ms']:g} ms"
        ),
    )
    for column in ("system", "samples", "samples/s", "MB/s", "TTFB s"):
        table.add_column(column, justify="left" if column == "system" else "right")
    for column in ("wait p50 ms", "p90", "p99", "max", "stall", "x base w2", "x limit"):
        table.add_column(column, justify="right")
    for name, s in result["systems"].items():
        wait = s["batch_wait_ms"]
        vs_base = result["ratios"].get(f"{name}_vs_baseline_w2")
        vs_limit = result["ratios"].get(f"{name}_vs_limit")
        table.add_row(
            _LABELS.get(name, name),
            str(s["samples"]),
            f"{s['samples_per_s']:,.0f}",
            f"{s['mb_per_s']:,.1f}",
            f"{s['ttfb_s']:.3f}",
            _ms(wait["p50"]),
            _ms(wait["p90"]),
            _ms(wait["p99"]),
            _ms(wait["max"]),
            f"{100 * s['stall_fraction']:.1f}%",
            "" if vs_base is None else f"{vs_base:,.1f}x",
            "" if vs_limit is None else f"{vs_limit:.2f}x {_limit_of(name, limits)[0]}",
        )
    console.print(table)
    console.print(_LEGEND)
    latency = limits["get_latency_ms"]
    console.print(
        f"limits: store ceiling {limits['store_get_mb_per_s']:,.1f} MB/s "
        f"(Store.get_many, concurrency {limits['store_best_concurrency']}); "
        f"GET latency p50 {latency['p50']:.2f} ms, p99 {latency['p99']:.2f} ms; "
        f"raw LMDB read {limits['lmdb_read_mb_per_s']:,.1f} MB/s "
        f"({limits['page_cache']}; {limits['lmdb_read_hot_mb_per_s']:,.1f} MB/s in memory); "
        f"memcpy {limits['memcpy_gb_per_s']:.1f} GB/s"
    )
    fresh = limits.get("fresh_pages") or {}
    if "page_cache" in fresh:
        console.print(
            escape(
                "the dataset's bytes into pages touched for the first time, a new process "
                "(NOTE[fresh-pages]): a new file's page cache "
                f"{fresh['page_cache']['mb_per_s']:,.0f} MB/s, new anonymous memory "
                f"{fresh['anon_first']['mb_per_s']:,.0f} MB/s, the same memory again "
                f"{fresh['anon_again']['mb_per_s']:,.0f} MB/s"
            )
        )
    elif "error" in fresh:
        console.print(escape(f"fresh pages: not measured ({fresh['error']})"))
    if "raw_get_mb_per_s" in limits:
        console.print(
            f"raw GET ceiling {limits['raw_get_mb_per_s']:,.1f} MB/s (bare obstore, no retry, "
            f"no transfer check, no ETag pin; the peers benchmark's GET ceiling): cold at "
            f"{result['ratios'].get('fastdata_cold_vs_raw_get_ceiling', 0):.2f}x it, "
            f"Store.get_many at {limits['store_get_mb_per_s'] / limits['raw_get_mb_per_s']:.2f}x it"
        )
    if "range_get_mb_per_s" in limits:
        console.print(
            f"8 MiB-range ceiling {limits['range_get_mb_per_s']:,.1f} MB/s of payload "
            f"(every shard in 8 MiB ranges, concurrency {limits['range_best_concurrency']}); "
            f"cold at {result['ratios'].get('fastdata_cold_vs_store_ceiling', 0):.2f}x the "
            "per-sample store ceiling"
        )
    if "transfer_check_ratio" in limits:
        console.print(
            f"transfer checks (verify_transfers='auto': MD5 of single-part ETags on plain "
            f"http, stored S3 checksums, record CRCs): cold pass at "
            f"{limits['transfer_check_ratio']:.2f}x the throughput of the same pass with "
            f"'never' ({limits['cold_unverified_mb_per_s']:,.1f} MB/s)"
        )
    console.print(cpu_line(result))
    console.print(
        f"dataset open (listing + index): {result['open_s']:.3f} s; upload "
        f"{result['upload_s']:.1f} s; whole run {result['total_s']:.1f} s"
    )
    workers = result.get("workers")
    if workers:
        console.print(
            f"num_workers={workers['num_workers']} ({workers['workers']['start']}) with a "
            f"per-sample transform: second epoch's first batch in "
            f"{workers['second_epoch_first_batch_s']:.3f} s (target <= "
            f"{workers['second_epoch_first_batch_target_s']:g} s), throughput "
            f"{workers['workers_vs_threads']:.2f}x threads mode's"
        )
    for t in result["targets"]:
        verdict = ("met" if t["met"] else "MISSED") if t["applies"] else "n/a at this size"
        console.print(f"target {t['target']}: {t['value']:.3g} ({verdict})")
        if t.get("cause"):
            console.print(escape(f"  {t['cause']}"))
    console.print(result["summary"])
    host = result["host"]
    load = [host.get(k) for k in ("load_avg_1m", "load_avg_1m_end")]
    console.print(
        f"{result['date']}; {host.get('cpu')}, {host.get('cores')} cores, "
        f"{host.get('memory_gib')} GiB, {host.get('os')}, Python {host.get('python')}"
        + (f"; load average {load[0]:.2f} at start, {load[1]:.2f} at end" if all(load) else "")
    )


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def cpu_line(result: dict[str, Any]) -> str:
    """CPU ms per sample, client / server, of the store ceiling and each throughput pass.

    The client figure is this process plus the baseline's worker processes; the server
    figure is the embedded server's (``-`` against an external endpoint).
    """

    def pair(cpu: dict[str, float | None] | None) -> str:
        if not cpu:
            return "-"
        return " / ".join(
            "-" if cpu.get(k) is None else f"{cpu[k]:.3f}" for k in ("client", "server")
        )

    parts = [f"store ceiling {pair(result['limits'].get('store_cpu_ms_per_sample'))}"]
    for name, figures in result["systems"].items():
        parts.append(f"{_LABELS.get(name, name)} {pair(figures.get('cpu_ms_per_sample'))}")
    return "CPU ms per sample, client / server (throughput passes): " + "; ".join(parts)
