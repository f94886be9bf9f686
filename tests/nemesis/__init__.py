"""Fault injection for tests between the proxy and what it depends on (see pgrelay)."""
