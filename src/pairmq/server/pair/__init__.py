"""The pair: drivers of the HA machines (ha/) around sockets and timers.

What the server asks of any HA policy (policy.py, with the null policy of a server
without a pair); the replication driver (replication.py) and the shared-store driver
(shared_store.py); the HA channel's connections (ha_link.py) and its plumbing written
once for both drivers (peer_channel.py); the witness: the client the drivers ask
(witness_client.py) and the `pairmq witness` process (witness_server.py)."""
