"""A stop request mid-warm (NOTE[warm-stop]): what was fetched is committed, the claims
are released, and a rerun fetches none of it again. Signals are tested over SeaweedFS
(tests/integration/test_warm_s3.py); here the stop comes from the progress callback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastdata.config import CacheConfig, FastdataConfig
from fastdata.errors import ConfigError
from fastdata.warm import DatasetSpec, WarmConfig, WarmStatus, WarmStop, warm
from fastdata.warm._claims import ClaimFile

SAMPLES = 200


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(SAMPLES):
        (root / f"{i:04d}.bin").write_bytes(rng.bytes(3000 + 7 * i))
    return root


@pytest.fixture
def config(tmp_path: Path) -> FastdataConfig:
    cache = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    return FastdataConfig(cache=cache)


class _StopAfter:
    """Requests the stop once some samples are settled (or at the first update)."""

    def __init__(self, stop: WarmStop, done: int) -> None:
        self.stop, self.done, self.updates = stop, done, 0

    def update(self, status: WarmStatus) -> None:
        self.updates += 1
        if status.done >= self.done:
            self.stop.request("test")


@pytest.mark.parametrize("after", [0, 40])
def test_a_stop_commits_what_was_fetched_and_the_rerun_fetches_only_the_rest(
    dataset: Path, config: FastdataConfig, after: int
) -> None:
    spec = DatasetSpec(str(dataset), layout="files")
    options = WarmConfig(concurrency=2, claim_bytes=64 * 1024, status_interval_s=0.001)
    stop = WarmStop()
    progress = _StopAfter(stop, after)
    first = warm(spec, config=config, options=options, progress=progress, stop=stop)
    assert first.stopped == "test"
    assert not first.complete
    assert first.fetched < SAMPLES
    assert first.fetched == first.requests  # every sample fetched was committed
    assert not stop.request("again")  # the loop is over: nothing holds fetched records
    # The claims are released: another process (here: a new claims file) can take all.
    second = warm(spec, config=config, options=options)
    assert second.complete
    assert second.already_cached == first.fetched
    assert second.fetched == second.requests == SAMPLES - first.fetched
    claims = ClaimFile.open(Path(config.cache.resolved_dir()), bytes.fromhex(first.dataset_id))
    try:
        assert all(claims.try_claim(u) for u in range(64))
    finally:
        claims.close()


def test_a_stop_requested_before_the_run_fetches_nothing(
    dataset: Path, config: FastdataConfig
) -> None:
    stop = WarmStop()
    assert not stop.request("early")  # no fetch loop runs: the caller stops its own way
    result = warm(DatasetSpec(str(dataset), layout="files"), config=config, stop=stop)
    assert (result.stopped, result.fetched, result.requests) == ("early", 0, 0)
    assert result.as_dict()["stopped"] == "early"


def test_stop_must_be_a_warm_stop(dataset: Path, config: FastdataConfig) -> None:
    with pytest.raises(ConfigError, match="stop must be a WarmStop"):
        warm(DatasetSpec(str(dataset), layout="files"), config=config, stop=True)  # type: ignore[arg-type]
