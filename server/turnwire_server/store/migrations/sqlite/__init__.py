"""SQLite schema migrations: ``NNNN_name.sql``, applied in version order."""
