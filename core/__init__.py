"""The records the authority keeps and the pure rules that decide on them: no I/O."""
