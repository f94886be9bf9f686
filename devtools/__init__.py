"""Developer tools that are not part of the proxy (not installed with it)."""
