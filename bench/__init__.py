"""Throughput and latency benchmark: fenceproxy against a plain pass-through proxy."""
