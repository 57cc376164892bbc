"""The journal kept in PostgreSQL ([store] url): its schema, the fenced lease that decides
which server writes it, the group-committed copy of the records and the restore of a local
copy from it (docs/database.md)."""
