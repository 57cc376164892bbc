"""Colocated backups (docs/cluster.md): each member runs its live and hosts the backup of
another live in a child process; three members back each other up in a ring. Real server
processes, a real etcd cluster as every pair's arbiter, a real kill -9 of a member's whole
process tree (its live and the backup it hosts at once).

What is checked is what an application relies on: every message a producer had confirmed
is consumed, each once; the live that lost its backup says so and gets another; the live
that died is served by its backup, where the clients and the other members' bridges find
it by themselves."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import stomp

from pairmq.core.cluster import sf_queue
from tests.ha.clients import FailoverConsumer, FailoverProducer
from tests.support.cli import run_pairmq
from tests.support.colocated import ColocatedCluster, children
from tests.support.etcd import EtcdCluster
from tests.support.exactly_once import NumberedLoad, assert_consumed_once
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
QUEUE = "/queue/colocated"


@pytest.mark.long  # CI time: a colocated member killed is tested in make test
def test_three_lives_back_each_other_up_in_a_ring(tmp_path: Path,
                                                   etcd_cluster: EtcdCluster) -> None:
    """Each live asks the next member; each member hosts one backup, a child process with
    its own ports at the offset and its own data directory under the member's; a stomp.py
    client is refused by a backup with the live's address, and served by the live."""
    members = ColocatedCluster(tmp_path, 3, etcd=etcd_cluster.url).start()
    try:
        members.wait_backed_up()
        assert [members.host_of(i) for i in range(3)] == [1, 2, 0]
        for i in range(3):
            hosted = members.colocated(i)["hosted"]  # type: ignore[index]
            assert [h["live"] for h in hosted] == [f"m{(i - 1) % 3}"], hosted
            (entry,) = hosted
            assert int(entry["stomp"].rpartition(":")[2]) == members.stomp[i] + members.offset
            assert entry["data_dir"].startswith(str(members.servers[i].data_dir))  # type: ignore[union-attr]
            assert entry["pid"] in children(members.servers[i].proc.pid)  # type: ignore[union-attr]
        # `pairmq status` on member 0 says where its backup is and whose it hosts
        shown = run_pairmq("status", "--admin", f"127.0.0.1:{members.admin[0]}")
        assert shown.returncode == 0, shown.stderr
        text = " ".join(shown.stdout.split())
        assert "Backup of this live: backed_up on member m1" in text, shown.stdout
        assert "Backups hosted here" in text and f"127.0.0.1:{members.backup_stomp(2)}" in text
        # the backup of live 0 (on member 1) refuses clients, naming live 0
        refused: list[str] = []

        class Listener(stomp.ConnectionListener):
            def on_error(self, frame: stomp.utils.Frame) -> None:
                refused.append(frame.body + repr(frame.headers))

        backup = stomp.Connection([("127.0.0.1", members.backup_stomp(0))])
        backup.set_listener("", Listener())
        try:
            backup.connect(wait=True)
        except stomp.exception.ConnectFailedException:
            pass
        wait_until(lambda: refused, "the backup's refusal", 5)
        assert str(members.stomp[0]) in refused[0], refused
        live = stomp.Connection([("127.0.0.1", members.stomp[0])])
        live.connect(wait=True)
        live.send(QUEUE, "to live 0", receipt="r1")
        live.disconnect()
        # a hosted backup that crashes is started again by its member, and its live is
        # backed up again (the backup copies what it missed)
        (crashed,) = [h["pid"] for h in members.colocated(0)["hosted"]]  # type: ignore[index]
        os.kill(crashed, signal.SIGKILL)
        wait_until(lambda: (h := members.colocated(0)["hosted"][0])["restarts"] == 1  # type: ignore[index]
                   and h["state"] == "running" and h["pid"] != crashed,
                   "member 0 starting the backup of live 2 again", 10)
        members.wait_backed_up([2])
        assert members.host_of(2) == 0
        assert members.servers[0].log_lines(  # type: ignore[union-attr]
            "backup of live m2 hosted here exited with signal 9: restarting it")
    finally:
        members.stop()
    # a member stopped: the backups it hosted stopped with it
    for server in members.servers:
        assert server is not None and not children(server.proc.pid)


def test_a_member_killed_takes_a_live_and_a_backup_and_nothing_receipted_is_lost(
        tmp_path: Path, etcd_cluster: EtcdCluster) -> None:
    """kill -9 of member 1's process tree takes live 1 and the backup of live 0 at once.
    Live 1's backup (on member 2) serves it; live 0 says it lost its backup and gets
    another (member 2 has room for two). Producers on every live, one consumer on member
    0 fed by its bridges: every receipted message consumed once."""
    members = ColocatedCluster(tmp_path, 3, etcd=etcd_cluster.url, max_backups=2).start()
    try:
        members.wait_backed_up()
        assert [members.host_of(i) for i in range(3)] == [1, 2, 0]
        addresses = [[("127.0.0.1", members.stomp[i]), ("127.0.0.1", members.backup_stomp(i))]
                     for i in range(3)]
        consumer = FailoverConsumer(addresses[0], QUEUE, prefetch=50).start()
        wait_until(lambda: all(sf_queue("m0", QUEUE) in b["subscriptions"]
                               for b in members.status(0)["cluster"]["bridges"]),  # type: ignore[index]
                   "member 0's bridges subscribed", 10)
        producers = [FailoverProducer(addresses[i], QUEUE, window=32) for i in range(3)]
        load = NumberedLoad(producers, "from live").start()
        time.sleep(2.0)
        members.kill_tree(1)
        # live 0 says it lost its backup, and gets another on member 2
        wait_until(lambda: members.servers[0].log_lines("lost its backup"),  # type: ignore[union-attr]
                   "live 0 saying it lost its backup", 10)
        wait_until(lambda: members.host_of(0) == 2 and members.backed_up(0),
                   "live 0 backed up again, on member 2", 60)
        time.sleep(2.0)
        load.finish()
        assert all(len(p.receipted) > 100 for p in producers), \
            [len(p.receipted) for p in producers]
        # live 1's producer carried on at its backup
        assert producers[1].connected_to[-1] == addresses[1][1], \
            f"live 1's producer is not at its backup: {producers[1].connected_to}"
        assert_consumed_once(consumer, load.receipted(), load.sent_ids())
        # member 1 restarts: its backup (serving live 1 on member 2) dials it, and live 1
        # takes its place back, backed up on member 2 again, serving what was sent there
        members.start_member(1)
        wait_until(lambda: (members.status(1) or {}).get("state") == "ACTIVE"
                   and members.host_of(1) == 2, "live 1 back on member 1, backed up", 60)
        producers[1].send("m1-after", b"after the failback")
        producers[1].flush()
        assert not consumer.wait_consumed({"m1-after"}, 30)
        assert consumer.consumed["m1-after"] == 1
        consumer.close()
        for p in producers:
            p.close()
    finally:
        members.stop()


def test_a_hosted_backup_with_scale_down_moves_its_dead_live_to_the_cluster(
        tmp_path: Path, etcd_cluster: EtcdCluster) -> None:
    """Colocated with `scale_down`: kill -9 of member 1's tree; live 1's backup (hosted by
    member 2) does not serve but moves live 1's messages, producer sequences and dup-ids
    to a live of the cluster, redirects live 1's producer there, and ends; its host does
    not start it again. Every receipted message consumed once, none lost to the producer."""
    members = ColocatedCluster(tmp_path, 3, etcd=etcd_cluster.url, max_backups=2,
                               flags=["--scale-down"]).start()
    try:
        members.wait_backed_up()
        live1 = [("127.0.0.1", members.stomp[1]), ("127.0.0.1", members.backup_stomp(1))]
        producer = FailoverProducer(live1, QUEUE, window=32)
        sent: list[str] = []
        for k in range(2000):
            producer.send(f"m1-{k}", f"from live 1: {k}".encode())
            sent.append(f"m1-{k}")
        producer.flush()
        stop = threading.Event()
        errors: list[BaseException] = []

        def produce() -> None:
            k = 2000
            try:
                while not stop.is_set():
                    producer.send(f"m1-{k}", f"from live 1: {k}".encode())
                    sent.append(f"m1-{k}")
                    k += 1
                    if k % 20 == 0:
                        time.sleep(0.01)
                producer.flush()
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=produce)
        thread.start()
        time.sleep(1.0)
        members.kill_tree(1)
        host = members.servers[2]
        assert host is not None
        wait_until(lambda: host.log_lines("backup of live m1 hosted here ended (exit 0)"),
                   "live 1's backup scaled down and ended", 90)
        # the producer was redirected to a live and carries on there
        wait_until(lambda: producer.connected_to[-1][1] in (members.stomp[0], members.stomp[2]),
                   "live 1's producer redirected to another live", 30)
        time.sleep(1.0)
        stop.set()
        thread.join(120)
        assert not errors, errors
        receipted = set(producer.receipted)
        assert len(receipted) > 2000
        time.sleep(3.0)  # the ended backup is not started again
        hosted = {h["live"]: h for h in members.colocated(2)["hosted"]}  # type: ignore[index]
        assert hosted["m1"]["state"] == "stopped", hosted
        consumer = FailoverConsumer([("127.0.0.1", members.stomp[0])], QUEUE,
                                    prefetch=50).start()
        assert_consumed_once(consumer, receipted, set(sent))
        consumer.close()
        producer.close()
    finally:
        members.kill_all()
