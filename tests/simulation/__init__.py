"""A seeded, deterministic, in-process simulation of the effect lifecycle.

Two store replicas on one database (SQLite file, or PostgreSQL), a simulated
clock, a simulated upstream that keeps its own records, workers with fresh and
stale leases, lost and late answers, stalls, restarts, sweeps, probes, an
operator and garbage collection, interleaved by a seeded scheduler; the
invariants (invariants.py) are checked after every step against the store's
tables and the upstream's records.

    python -m tests.simulation --seed 1 --steps 5000 --backend sqlite

Modules: driver.py (every Store call), tables.py (direct reads for the checks),
upstream.py, world.py (model, scheduler, steps), invariants.py, runner.py,
__main__.py (the command line).
"""
