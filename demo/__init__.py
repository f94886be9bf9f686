"""Demo upstream, process helpers and the `make run` launcher."""
