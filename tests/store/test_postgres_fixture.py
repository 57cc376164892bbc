"""The `postgres_server` and `postgres_db` fixtures (tests/support/postgres.py) run a real
PostgreSQL: what a test commits survives the server's crash and restarts, as it does in use."""

from __future__ import annotations

import psycopg
import pytest

from tests.support.postgres import PASSWORD, USER, PostgresError, PostgresServer, require_postgres


def test_a_committed_row_survives_an_immediate_and_a_fast_restart(
        postgres_server: PostgresServer, postgres_db: str) -> None:
    server = postgres_server
    database = postgres_db.rsplit("/", 1)[1]
    assert postgres_db == server.url(database)
    assert postgres_db.startswith(f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{server.port}/")

    with psycopg.connect(postgres_db) as conn:  # commits at the end of the block
        conn.execute("CREATE TABLE orders (id integer PRIMARY KEY, item text NOT NULL)")
        conn.execute("INSERT INTO orders VALUES (1, 'first')")
    assert server.sql("SELECT id, item FROM orders", database=database) == "1|first\n"

    # a connection open across the restart is cut: the server went away under it
    survivor = psycopg.connect(postgres_db, autocommit=True)
    server.restart("immediate")  # no shutdown checkpoint: crash recovery replays the WAL
    with pytest.raises(psycopg.OperationalError):
        survivor.execute("SELECT 1")
    survivor.close()
    with psycopg.connect(postgres_db) as conn:
        assert conn.execute("SELECT id, item FROM orders").fetchall() == [(1, "first")]
        conn.execute("INSERT INTO orders VALUES (2, 'second')")

    server.restart("fast")
    with psycopg.connect(postgres_db) as conn:
        assert conn.execute("SELECT id FROM orders ORDER BY id").fetchall() == [(1,), (2,)]
    assert "database system was not properly shut down" in server.log_path.read_text()


def test_a_killed_server_keeps_what_it_committed(postgres_server: PostgresServer,
                                                 postgres_db: str) -> None:
    server = postgres_server
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x integer)")
        conn.execute("INSERT INTO t VALUES (7)")
    old_pid = server.pid
    server.kill()  # SIGKILL: the postmaster and its children are gone when it returns
    assert not server.alive()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(postgres_db, connect_timeout=2)
    server.start()
    assert server.pid != old_pid
    with psycopg.connect(postgres_db) as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(7,)]


def test_a_server_of_its_own_is_removed_when_closed() -> None:
    require_postgres()
    with PostgresServer() as server:
        assert server.alive()
        url = server.create_database("mine")
        with pytest.raises(PostgresError, match="already exists"):
            server.create_database("mine")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT current_user, current_database()").fetchone() == (
                USER, "mine")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(url.replace(PASSWORD, "wrong"))
    assert not server.alive()
    assert not server.workdir.exists()
