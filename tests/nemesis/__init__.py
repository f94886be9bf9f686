"""The nemesis: a seeded run of workers through real proxy replicas while faults hit the
processes around them, judged only by the upstream's own records and the workers' answers.

* `schedule.py`: what a seed decides (each worker's operations, each fault and when),
  pure and printable, so a failing run can be replayed from its seed;
* `harness.py`: the processes (a demo upstream, proxy replicas, a store) and the run;
* `judge.py`: the checks, on plain records, no I/O;
* `pgrelay.py`: a TCP relay in front of PostgreSQL that cuts or holds a transaction at
  its COMMIT, or every connection (the relay faults);
* `python -m tests.nemesis` (`make chaos`): seeds one after another for a duration.

docs/contributing/nemesis.md says what it injects, what the judge checks and how to
replay a seed.
"""
