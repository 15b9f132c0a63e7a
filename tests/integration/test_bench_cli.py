"""``fastdata bench --quick`` as a user runs it: the JSON is complete and sane (not fast).

Complete: every system and every figure of issue 8's shape is there. Sane: the counts
equal the dataset size, no figure is zero or negative, the warm and hot systems read
nothing from the store (the cold epoch really filled the cache), and a run against a
given endpoint deletes what it wrote and nothing else (NOTE[bench-ownership]).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fastdata.store import Store

pytestmark = pytest.mark.integration

SYSTEMS = ("baseline_w0", "baseline_w2", "fastdata_cold", "fastdata_warm", "fastdata_hot")
FIGURES = ("samples", "samples_per_s", "mb_per_s", "ttfb_s", "stall_fraction")
WAITS = ("p50", "p90", "p99", "max")


def run_bench(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fastdata", "bench", "--quick", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fastdata cold" in proc.stdout  # the table was printed
    assert "data-loading latency" in proc.stdout
    assert "pages touched for the first time" in proc.stdout  # the fresh-page limit
    return json.loads(out.read_text())


def check_result(result: dict[str, Any]) -> None:
    samples = result["config"]["samples"]
    limits = result["limits"]
    for key in ("store_get_mb_per_s", "raw_get_mb_per_s", "lmdb_read_mb_per_s", "memcpy_gb_per_s"):
        assert limits[key] > 0, key
    assert result["ratios"]["fastdata_cold_vs_raw_get_ceiling"] > 0
    assert 0 < limits["get_latency_ms"]["p50"] <= limits["get_latency_ms"]["p99"]
    assert limits["lmdb_missing"] == 0
    fresh = limits["fresh_pages"]  # the dataset's bytes, written three ways
    assert fresh["bytes"] == samples * result["config"]["sample_bytes"]
    for kind in ("page_cache", "anon_first", "anon_again"):
        assert fresh[kind]["mb_per_s"] > 0, (kind, fresh[kind])
    assert set(result["systems"]) == set(SYSTEMS)
    for name in SYSTEMS:
        system = result["systems"][name]
        for key in FIGURES:
            assert system[key] > 0, (name, key, system[key])
        assert system["samples"] == samples, name
        waits = system["batch_wait_ms"]
        assert all(waits[k] > 0 for k in WAITS), (name, waits)
        assert waits["p50"] <= waits["p90"] <= waits["p99"] <= waits["max"], (name, waits)
        assert system["stall_fraction"] <= 1.0
        assert system["mb_per_s"] == pytest.approx(
            system["samples_per_s"] * result["config"]["sample_bytes"] / 1e6
        )
    systems = result["systems"]
    # Two cold passes, each from an empty cache, read every sample from the store ...
    assert systems["fastdata_cold"]["store_samples"] == 2 * samples
    # ... and the cache they filled serves warm and hot without the store.
    assert systems["fastdata_warm"]["store_samples"] == 0
    assert systems["fastdata_hot"]["store_samples"] == 0
    assert {t["target"] for t in result["targets"]} >= {"cold time to first batch <= 0.5 s"}
    assert "ms ->" in result["summary"]
    # CPU per sample: the client's always; the server's only for the embedded one.
    embedded = result["config"]["endpoint"].startswith("embedded")
    for cpu in [limits["store_cpu_ms_per_sample"]] + [
        s["cpu_ms_per_sample"] for s in systems.values()
    ]:
        assert cpu["client"] > 0, cpu
        assert (
            (cpu["server"] is not None and cpu["server"] >= 0)
            if embedded
            else cpu["server"] is None
        )


def test_quick_run_on_the_embedded_server_writes_complete_sane_json(tmp_path: Path) -> None:
    plot = tmp_path / "bench.png"
    result = run_bench(tmp_path, "--plot", str(plot))
    check_result(result)
    assert result["config"]["endpoint"].startswith("embedded SeaweedFS")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_against_an_endpoint_deletes_only_what_it_wrote(s3_bucket: Any, tmp_path: Path) -> None:
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many([("keep/me.txt", b"not the benchmark's")])
    result = run_bench(
        tmp_path,
        "--endpoint-url",
        s3_bucket.endpoint_url,
        "--bucket",
        s3_bucket.bucket,
        "--layout",
        "packed",
        "--samples",
        "300",
        env=s3_bucket.env,
    )
    check_result(result)
    assert result["config"]["layout"] == "packed"
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        left = [info.path for info in store.list()]
    assert left == ["keep/me.txt"]
