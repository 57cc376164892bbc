"""The data source over TLS (issue 19): the client's TLS options (trustStorePath, ...)
pass through `.option(...)` to every task, for reads and writes."""

from __future__ import annotations

import pytest
from tests.serverproc import free_port
from tests.support.certs import make_pki
from tests.support.spark import append, drain


def test_read_and_write_over_tls(spark, server_factory, tmp_path) -> None:
    pki = make_pki(tmp_path / "pki")
    port = free_port()
    srv = server_factory("--stomp-tls", f"127.0.0.1:{port}", *pki.server_flags())
    url = f"failover:(stomp+ssl://127.0.0.1:{port})?trustStorePath={pki.ca_file}"
    append(url, "secure", 60)
    rows = (spark.read.format("pairmq").option("servers", f"stomp+ssl://127.0.0.1:{port}")
            .option("trustStorePath", pki.ca_file).option("verifyHost", "true")
            .option("stream", "secure").load().collect())
    assert sorted(r.offset for r in rows) == list(range(60))
    df = spark.createDataFrame([(f"row-{i}".encode(),) for i in range(40)], "body binary")
    (df.repartition(2).write.format("pairmq").option("servers", f"stomp+ssl://127.0.0.1:{port}")
     .option("trustStorePath", pki.ca_file).option("destination", "/queue/secure-out")
     .mode("append").save())
    got = drain(url, "/queue/secure-out", 40)
    assert sum(got.values()) == 40 and set(got.values()) == {1}
    # without the CA the tasks cannot trust the server: the query fails, naming why
    with pytest.raises(Exception, match="certificate"):
        (spark.read.format("pairmq").option("servers", f"stomp+ssl://127.0.0.1:{port}")
         .option("stream", "secure").option("initialConnectAttempts", "1").load().collect())
    assert "STOMP over TLS" in srv.logs()
