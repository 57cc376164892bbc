"""The `etcd_cluster` fixture (tests/support/etcd.py) runs a real etcd cluster: the tests of
the etcd arbiter rely on its members failing and coming back as etcd's do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.etcd import EtcdCluster, EtcdError, require_etcd

NO_MAJORITY_WAIT_S = 1.0  # a put that cannot commit is given up after this


def test_a_cluster_stores_keeps_a_majority_and_loses_it(etcd_cluster: EtcdCluster) -> None:
    cluster = etcd_cluster
    assert cluster.url == "etcd://" + ",".join(cluster.endpoints)
    assert len(cluster.endpoints) == 3
    first_leader = cluster.wait_leader()

    for member in range(3):  # every member serves writes and linearizable reads
        cluster.put(f"/test/k{member}", f"v{member}", member=member)
    assert cluster.get("/test/k0", member=2) == b"v0"
    assert cluster.get_prefix("/test/") == {f"/test/k{i}": f"v{i}".encode() for i in range(3)}

    cluster.kill(first_leader)
    second_leader = cluster.wait_leader()
    assert second_leader != first_leader
    cluster.put("/test/after-leader-died", "yes")
    assert cluster.get("/test/after-leader-died") == b"yes"

    survivor = next(i for i in range(3) if i not in (first_leader, second_leader))
    cluster.kill(second_leader)  # two of three down: no majority
    assert cluster.leader() is None
    with pytest.raises(EtcdError):
        cluster.put("/test/without-majority", "no", member=survivor,
                    timeout=NO_MAJORITY_WAIT_S)

    cluster.restart(first_leader)
    cluster.restart(second_leader)
    cluster.wait_leader()
    cluster.put("/test/majority-back", "yes", member=first_leader)
    assert cluster.get("/test/majority-back", member=survivor) == b"yes"
    assert cluster.get("/test/k1", member=second_leader) == b"v1"  # the data dirs were kept


def test_a_paused_member_is_no_leader_and_comes_back(etcd_cluster: EtcdCluster) -> None:
    cluster = etcd_cluster
    leader = cluster.wait_leader()
    with cluster.paused(leader):
        with pytest.raises(EtcdError):
            cluster.get("/test/k", member=leader, timeout=0.3)
        new_leader = cluster.wait_leader()
        assert new_leader != leader
        cluster.put("/test/while-paused", "yes", member=new_leader)
    assert cluster.wait_leader() in range(3)
    assert cluster.get("/test/while-paused", member=leader, timeout=5.0) == b"yes"


def test_no_member_outlives_the_cluster(tmp_path: Path) -> None:
    require_etcd()
    with EtcdCluster(tmp_path / "etcd", members=1) as cluster:
        procs = [m.proc for m in cluster.members]
        cluster.pause(0)  # even a paused one is killed
    assert all(p is not None and p.poll() is not None for p in procs)
