"""A deterministic simulator of the replication pair (docs/ha.md, "Simulator")."""
