"""Bad arguments give one clear line and exit status 2, never a traceback; warm needs no torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def fastdata(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "fastdata", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        cwd=REPO,
    )


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    for i in range(5):
        (root / f"{i}.bin").write_bytes(b"x" * (i + 1))
    return root


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["warm"], "Missing argument 'URL'"),
        (["warm", "{data}", "--concurrency", "0"], "--concurrency"),
        (["warm", "{data}", "--max-bytes", "lots"], "cannot parse size 'lots'"),
        (["warm", "{data}", "--layout", "zip"], "'zip' is not one of"),
        (["warm", "{data}", "--storage-option", "novalue"], "use KEY=VALUE"),
        (["warm", "{data}", "--seed", "1"], "--seed: use with --plan"),
        (["warm", "{data}", "--plan"], "--plan needs --batch-size"),
        (
            [
                "warm",
                "{data}",
                "--plan",
                "--batch-size",
                "2",
                "--world-size",
                "2",
                "--node-rank",
                "5",
            ],
            "node_rank",
        ),
        (["warm", "{data}/missing", "--layout", "files"], "no objects under"),
        (["warm", "{data}", "--layout", "files", "--field", "jpg"], "fixed fields"),
        (
            ["warm", "{data}", "--layout", "files", "--layout-option", "colour=1"],
            "unknown files layout option",
        ),
        (["warm", "{data}", "--max-bytes", "10"], "at least 1 MiB"),
        (["doctor", "{data}", "--step-time", "0"], "--step-time"),
        (["stats", "--max-bytes", "-1"], "cannot parse size"),
        (["clear", "--dataset", "x", "--cache-dir", "{data}/c"], "needs --yes"),
        (
            ["warm", "{data}", "--layout", "files", "--cache-dir", "{data}/0.bin/c"],
            "cannot be used",
        ),
        (
            ["doctor", "{data}", "--layout", "files", "--cache-dir", "{data}/0.bin/c"],
            "doctor measures the disk of the cache in it",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_clear_line(
    data: Path, args: list[str], message: str
) -> None:
    done = fastdata(*(a.replace("{data}", str(data)) for a in args))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_environment_is_a_clear_error(data: Path) -> None:
    done = fastdata("warm", str(data), env={"FASTDATA_CACHE_MAX_BYTES": "huge"})
    assert done.returncode == 2
    assert "FASTDATA_CACHE_MAX_BYTES" in done.stderr
    assert "Traceback" not in done.stderr
    torchrun = fastdata("warm", str(data), "--plan", "--batch-size", "2", env={"WORLD_SIZE": "x"})
    assert torchrun.returncode == 2
    assert "WORLD_SIZE='x' is not an integer" in torchrun.stderr


def test_warm_stats_doctor_and_clear_never_import_torch(data: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from fastdata.cli import main
        for argv in (
            ["warm", {str(data)!r}, "--layout", "files", "--quiet"],
            ["stats"],
            ["doctor", {str(data)!r}, "--layout", "files", "--latency-samples", "2"],
            ["clear", "--yes"],
        ):
            try:
                main(argv)
            except SystemExit as exc:
                assert exc.code in (0, None), (argv, exc.code)
        print("torch" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**__import__("os").environ, "FASTDATA_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_pack_warm_and_doctor_take_the_same_source_store_and_concurrency_options() -> None:
    import click

    from fastdata.cli import cli

    def options(command: str) -> dict[str, click.Option]:
        params = cli.commands[command].params
        return {p.name: p for p in params if isinstance(p, click.Option) and p.name}

    pack, warm, doctor = options("pack"), options("warm"), options("doctor")
    for name in ("layout", "pattern", "fields", "storage_option", "endpoint_url"):
        assert pack[name].opts == warm[name].opts == doctor[name].opts, name
        assert pack[name].help == warm[name].help == doctor[name].help, name
        assert pack[name].multiple == warm[name].multiple, name
    limits = [(o["concurrency"].default, o["concurrency"].type.max) for o in (pack, warm, doctor)]  # type: ignore[attr-defined]
    assert limits == [(4, 256), (32, 4096), (32, 4096)]


def test_pack_reads_json_storage_options_and_the_endpoint(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "packed"
    done = fastdata(
        "pack", str(data), str(out), "--concurrency", "2",
        "--storage-option", "use_listings_cache=false", "--endpoint-url", "http://127.0.0.1:9",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = {p.name for p in out.iterdir()}
    assert "_fastdata_pack.json" in names
    assert any(n.endswith(".fdpack") for n in names)
    refused = fastdata("pack", str(data), str(out), "--concurrency", "0")
    assert refused.returncode == 2
    assert "--concurrency" in refused.stderr
