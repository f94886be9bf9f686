"""Several fenceproxy processes sharing one PostgreSQL database, and fence-restore."""
