"""fenceproxy: the lease authority and fencing reverse proxy."""
