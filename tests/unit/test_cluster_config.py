"""The cluster cache's settings and discovery arguments (docs/cluster.md)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fastdata
from fastdata.config import CacheConfig, ClusterConfig, FastdataConfig, Rendezvous
from fastdata.dataset import cluster_directory, with_cluster
from fastdata.errors import ConfigError
from fastdata.testing.seaweedfs import free_port

TORCHRUN = {
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "GROUP_RANK": "2",
    "GROUP_WORLD_SIZE": "4",
    "TORCHELASTIC_RUN_ID": "job7",
}


def test_rendezvous_comes_from_torchruns_variables() -> None:
    assert Rendezvous.from_env(TORCHRUN) == Rendezvous("10.0.0.1", 29500, 2, 4, "job7")
    assert Rendezvous.from_env({}) is None
    older = {k: v for k, v in TORCHRUN.items() if k != "GROUP_WORLD_SIZE"}
    older |= {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "4"}
    assert Rendezvous.from_env(older) == Rendezvous("10.0.0.1", 29500, 2, 4, "job7")
    with pytest.raises(ConfigError, match="MASTER_PORT='x'"):
        Rendezvous.from_env(TORCHRUN | {"MASTER_PORT": "x"})
    with pytest.raises(ConfigError, match="outside the job's 4 node"):
        Rendezvous.from_env(TORCHRUN | {"GROUP_RANK": "4"})


def test_cluster_settings_come_from_the_environment_and_are_checked() -> None:
    config = FastdataConfig.from_env(
        {
            "FASTDATA_CLUSTER_ENABLED": "true",
            "FASTDATA_CLUSTER_PEERS": "a:1, b:2",
            "FASTDATA_CLUSTER_NODE": "1",
            "FASTDATA_CLUSTER_TOKEN": "s3cret",
            "FASTDATA_CLUSTER_TIMEOUT_S": "2.5",
        }
    )
    assert config.cluster.enabled
    assert config.cluster.peer_list == ["a:1", "b:2"]
    assert (config.cluster.node, config.cluster.timeout_s) == (1, 2.5)
    directory = cluster_directory(config.cluster)
    assert (directory.node, directory.nodes, directory.token) == (1, (0, 1), "s3cret")
    assert directory.listen() == ("b", 2)
    with pytest.raises(ConfigError, match="timeout_s"):
        ClusterConfig(timeout_s=0)
    with pytest.raises(ConfigError, match="cluster node"):
        ClusterConfig(node=-1)


def test_without_torchrun_or_a_peer_list_the_cluster_cache_says_what_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="needs torchrun"):
        cluster_directory(ClusterConfig(enabled=True))
    with pytest.raises(ConfigError, match="FASTDATA_CLUSTER_NODE"):
        cluster_directory(ClusterConfig(enabled=True, peers="a:1,b:2"))


def test_dataset_cluster_cache_is_checked(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="cluster_cache must be True or False"):
        fastdata.Dataset(tmp_path / "d", cluster_cache="yes")  # type: ignore[arg-type]
    off = FastdataConfig(cache=CacheConfig(enabled=False))
    with pytest.raises(ConfigError, match="the cache is disabled"):
        fastdata.Dataset(tmp_path / "d", config=off, cluster_cache=True)
    bad = FastdataConfig(cluster=ClusterConfig(peers="a:1,a:1", node=0, token="t"))
    with pytest.raises(ConfigError, match="distinct"):
        with_cluster(bad)
    peers = f"127.0.0.1:{free_port()}"
    listed = FastdataConfig(
        cache=CacheConfig(dir=str(tmp_path / "c"), min_free_bytes=0),
        cluster=ClusterConfig(peers=peers, node=0, token="t"),
    )
    with fastdata.Dataset(tmp_path / "d", config=listed, cluster_cache=True) as dataset:
        assert dataset.config.cluster.enabled
        loader = fastdata.DataLoader(dataset, batch_size=1)
        assert [bytes(b["data"].item(0).numpy()) for b in loader] == [b"x"]
        stats = loader.stats().cache
        assert stats is not None
        peer = next(t for t in stats["tiers"] if t["name"] == "peer")
        assert peer["state"] == f"ok: node 0 (serving at {peers})"


def eventually(check: Any) -> Any:
    """``check()`` once it is truthy (bounded: 10 s): a key another TCPStore client set
    was seen here to appear to this client a moment after ``set`` returned."""
    deadline = time.monotonic() + 10
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return value


def test_the_rendezvous_store_gives_one_token_and_every_published_address() -> None:
    from datetime import timedelta

    from torch.distributed import TCPStore

    from fastdata.dataset import RendezvousDirectory

    port = free_port()
    master = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))
    try:
        cluster = ClusterConfig(enabled=True, wait_s=0.2)
        nodes = [
            RendezvousDirectory(Rendezvous("127.0.0.1", port, node, 2, "job"), cluster)
            for node in (0, 1)
        ]
        assert nodes[0].token == nodes[1].token != ""
        assert nodes[0].listen() == ("127.0.0.1", 0)
        assert nodes[0].address(1) is None
        assert nodes[0].wait_all(0.2) is False  # nobody published: bounded, then go on
        nodes[1].publish("127.0.0.1:4242")
        assert eventually(lambda: nodes[0].address(1)) == "127.0.0.1:4242"
        nodes[0].publish("127.0.0.1:4141")
        assert eventually(lambda: nodes[1].address(0)) == "127.0.0.1:4141"
        # The node's later processes do not wait again (one wait per job and node).
        later = RendezvousDirectory(Rendezvous("127.0.0.1", port, 0, 2, "job"), cluster)
        assert later.wait_all(30) is True
        other_job = RendezvousDirectory(Rendezvous("127.0.0.1", port, 0, 2, "job2"), cluster)
        assert other_job.token != nodes[0].token
        assert other_job.address(1) is None
    finally:
        del master  # the store stops with its master


def test_only_a_nodes_first_process_waits_for_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from torch.distributed import TCPStore

    from fastdata.dataset import RendezvousDirectory, _cluster

    port = free_port()
    master = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))
    try:
        cluster = ClusterConfig(enabled=True)
        first = RendezvousDirectory(Rendezvous("127.0.0.1", port, 0, 2, "j"), cluster)
        assert first.wait_all(0.1) is False  # node 1 never comes
        marker = "fastdata/cluster/j/waited/default/0"
        assert eventually(lambda: first._store.check([marker]))

        # A later process that polled even once would sleep for an hour: it must not.
        monkeypatch.setattr(_cluster, "_POLL_S", 3600.0)
        later = RendezvousDirectory(Rendezvous("127.0.0.1", port, 0, 2, "j"), cluster)
        result: list[bool] = []
        waiter = threading.Thread(target=lambda: result.append(later.wait_all(60)), daemon=True)
        waiter.start()
        waiter.join(timeout=60)  # a hang guard only: a poll would take 3600 s
        assert result == [False], "a later process of the node waited again"
    finally:
        del master  # the store stops with its master


def test_each_cache_dir_of_a_job_has_its_own_published_address() -> None:
    from datetime import timedelta

    from torch.distributed import TCPStore

    from fastdata.dataset import RendezvousDirectory, cache_share

    a = cache_share(CacheConfig(dir="/data/a"), ClusterConfig())
    b = cache_share(CacheConfig(dir="/data/b"), ClusterConfig())
    assert a != b
    assert a == cache_share(CacheConfig(dir="/data/a/"), ClusterConfig())
    named = ClusterConfig(cache_name="train")  # cache dirs that differ by path per node
    assert cache_share(CacheConfig(dir="/n0"), named) == cache_share(CacheConfig(dir="/n1"), named)
    port = free_port()
    master = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))
    try:
        cluster = ClusterConfig(enabled=True, wait_s=0.2)

        def directory(node: int, share: str) -> RendezvousDirectory:
            return RendezvousDirectory(
                Rendezvous("127.0.0.1", port, node, 2, "job"), cluster, share
            )

        directory(0, a).publish("127.0.0.1:4001")
        directory(0, b).publish("127.0.0.1:4002")  # a second dataset, another cache dir
        assert eventually(lambda: directory(1, a).address(0)) == "127.0.0.1:4001"
        assert eventually(lambda: directory(1, b).address(0)) == "127.0.0.1:4002"
    finally:
        del master  # the store stops with its master


def test_the_token_is_never_printed() -> None:
    cluster = ClusterConfig(peers="a:1", node=0, token="s3cret-token")
    assert "s3cret-token" not in repr(cluster)
    assert "s3cret-token" not in repr(FastdataConfig(cluster=cluster))
    assert cluster.token == "s3cret-token"


def test_a_node_waits_only_for_the_other_nodes() -> None:
    from datetime import timedelta

    from torch.distributed import TCPStore

    from fastdata.dataset import RendezvousDirectory

    port = free_port()
    master = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))
    try:
        cluster = ClusterConfig(enabled=True)
        node0 = RendezvousDirectory(Rendezvous("127.0.0.1", port, 0, 2, "j"), cluster, "s")
        node1 = RendezvousDirectory(Rendezvous("127.0.0.1", port, 1, 2, "j"), cluster, "s")
        node1.publish("127.0.0.1:4001")
        assert eventually(lambda: node0.address(1))
        # Node 0 could not serve (its cache directory is broken): it never asks itself,
        # so it does not wait for its own address.
        assert node0.wait_all(60) is True
    finally:
        del master  # the store stops with its master


def test_a_dataset_whose_cache_dir_is_under_a_file_still_delivers(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for i in range(4):
        (tmp_path / "d" / f"{i}.bin").write_bytes(bytes([i]) * 10)
    (tmp_path / "file").write_bytes(b"not a directory")
    config = FastdataConfig(
        cache=CacheConfig(dir=str(tmp_path / "file" / "c"), min_free_bytes=0),
        cluster=ClusterConfig(
            peers=f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}", node=0, token="t"
        ),
    )
    with fastdata.Dataset(tmp_path / "d", config=config, cluster_cache=True) as dataset:
        loader = fastdata.DataLoader(dataset, batch_size=2)
        got = sorted(bytes(b["data"].item(i).numpy()) for b in loader for i in range(2))
        assert got == [bytes([i]) * 10 for i in range(4)]  # from the store, byte-identical
        stats = loader.stats().cache
        assert stats is not None
        peer = next(t for t in stats["tiers"] if t["name"] == "peer")
        assert peer["state"] == "ok: node 0 (client)"
