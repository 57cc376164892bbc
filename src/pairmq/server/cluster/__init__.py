"""The cluster of members (docs/cluster.md): bridges between the members' active servers,
and what this server tells the others (node.py)."""
