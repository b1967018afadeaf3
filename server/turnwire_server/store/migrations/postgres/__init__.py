"""PostgreSQL schema migrations (``NNNN_name.sql``); see ``store/postgres/migrations.py``."""
