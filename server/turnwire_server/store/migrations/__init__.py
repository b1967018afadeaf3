"""Schema migrations, one directory per backend."""
