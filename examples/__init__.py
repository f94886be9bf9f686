"""Runnable examples built on the fenceproxy client library (not part of the server)."""
