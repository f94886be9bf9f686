"""Helpers for running fenceproxy from outside: the demo launcher, the benchmark and
the tests that start real processes use them. The proxy's own packages never do."""
