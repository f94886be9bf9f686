"""One simulation run: set up the store (two replicas on one database), run the
seeded steps with the checks after each, drain, check liveness, report."""

from __future__ import annotations

import asyncio
import hashlib
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from tests.integration.app import backends
from tests.simulation import driver, tables
from tests.simulation.driver import Authority, Backend, Replica
from tests.simulation.invariants import (
    BUG_LETTERS,
    EXPECTED_TO_FAIL_BEFORE_FIX,
    Checker,
    Evidence,
    StepInfo,
    Violation,
)
from tests.simulation.tables import Tables
from tests.simulation.upstream import SimUpstream
from tests.simulation.world import REPLICAS, T0, ReplicaState, World, sim_policy

DRAIN_MAX_STEPS = 2000
DRAIN_MAX_TICKS = 60


@dataclass(frozen=True)
class RunConfig:
    seed: int
    steps: int
    backend: Backend
    evidence: Evidence = Evidence.TRUTHFUL
    # Causes that do not stop the run (reported, their subjects tainted).
    allowed: frozenset[str] = EXPECTED_TO_FAIL_BEFORE_FIX
    stop_on: str | None = None  # stop at the first violation with this cause
    trace_lines: int = 40
    echo: bool = False  # print every step as it runs
    # Handlers cancelled in the middle of a dispatch (world.World.do_cancel); off, a seed
    # takes the steps it took before the simulation had them.
    cancellations: bool = True
    # A pause after every step, as a loaded machine makes.
    pause_s: float = 0.0

    def replay(self, steps: int, stop_on: str | None = None) -> str:
        command = (
            f"python -m tests.simulation --seed {self.seed} --steps {steps} "
            f"--backend {self.backend} --evidence {self.evidence.value}"
        )
        if not self.allowed:
            command += " --strict"
        if not self.cancellations:
            command += " --no-cancellations"
        if stop_on is not None:
            command += f" --stop-on {stop_on}"
        return command


@dataclass(frozen=True)
class Finding:
    violation: Violation
    step: int
    tick: int
    step_text: str
    drain: bool
    trace: tuple[str, ...]


@dataclass
class RunResult:
    config: RunConfig
    steps_run: int = 0
    drain_steps: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU (all threads; not the PostgreSQL server's)
    fatal: Finding | None = None
    known: dict[str, Finding] = field(default_factory=dict)
    known_counts: Counter[str] = field(default_factory=Counter)
    consequences: int = 0
    effects: int = 0
    upstream_requests: int = 0
    reads_overtaken: int = 0  # reads a write committed in the middle of (I8)
    # Keys the upstream applied twice or more (routes that do not deduplicate), by
    # the cause reported for the key first: the damage the bugs did in this run.
    double_effects: Counter[str] = field(default_factory=Counter)
    # A digest of every step's trace line: equal digests, equal runs (same seed on
    # both backends, or the same seed twice).
    trace_digest: str = ""
    # Receipts by the writer they were given (driver.Receipt.path).
    receipts_by_path: Counter[str] = field(default_factory=Counter)
    # Cancelled handlers' receipts, by when they came (world.World.cancelled_receipts).
    cancellations: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return self.fatal is None

    def replay(self, finding: Finding) -> str:
        steps = self.config.steps if finding.drain else finding.step
        stop_on = None
        if finding is not self.fatal or self.config.stop_on is not None:
            stop_on = finding.violation.cause
        return self.config.replay(steps, stop_on)

    def summary(self) -> str:
        c = self.config
        per = self.elapsed_s / max(1, self.steps_run + self.drain_steps) * 1000
        head = (
            f"seed {c.seed} {c.backend} {c.evidence.value}: {self.steps_run} steps "
            f"+ {self.drain_steps} drain in {self.elapsed_s:.1f}s, cpu {self.cpu_s:.1f}s "
            f"({per:.2f} ms/step; {self.effects} effects, {self.upstream_requests} upstream "
            f"requests, {self.reads_overtaken} reads overtaken by a write; receipts: "
            f"{self.receipts_by_path['one statement']} in one statement, "
            f"{self.receipts_by_path['steps']} step by step)"
        )
        lines = [head]
        for cause, finding in sorted(self.known.items(), key=lambda kv: kv[1].step):
            letter = BUG_LETTERS.get(cause)
            tag = f" (bug {letter})" if letter else ""
            lines.append(
                f"  known: {finding.violation.invariant} {cause}{tag} x{self.known_counts[cause]},"
                f" first at step {finding.step}: {self.replay(finding)}"
            )
        if self.consequences:
            lines.append(f"  {self.consequences} later violation(s) on already-reported subjects")
        if self.double_effects:
            causes = ", ".join(f"{c}: {n}" for c, n in sorted(self.double_effects.items()))
            lines.append(
                f"  double effects upstream: {sum(self.double_effects.values())} ({causes})"
            )
        if self.fatal is not None:
            lines.append(f"  FAILED: {self.fatal.violation.invariant} {self.fatal.violation.cause}")
        return "\n".join(lines)

    def failure_report(self) -> str:
        assert self.fatal is not None
        return report(self, self.fatal)


def report(result: RunResult, finding: Finding) -> str:
    c = result.config
    v = finding.violation
    where = "drain step" if finding.drain else "step"
    lines = [
        f"SIMULATION: invariant {v.invariant} violated ({v.cause}) at {where} {finding.step} "
        f"(seed {c.seed}, backend {c.backend}, {c.evidence.value} evidence, tick {finding.tick})",
        f"  step:   {finding.step_text}",
        f"  detail: {v.detail}",
        f"  replay: {result.replay(finding)}",
        f"  last {len(finding.trace)} steps:",
    ]
    lines += [f"    {line}" for line in finding.trace]
    return "\n".join(lines)


class Run:
    def __init__(self, config: RunConfig, world: World, result: RunResult) -> None:
        self.config = config
        self.world = world
        self.result = result
        self.digest = hashlib.sha256()

    def traced(self) -> None:
        line = self.world.trace[-1]
        self.digest.update(line.encode() + b"\n")
        if self.config.echo:
            print(line)

    def handle(self, violations: list[Violation], step: StepInfo, drain: bool) -> bool:
        """Record what the step violated; False if the run must stop."""
        checker = self.world.checker
        for v in violations:
            if checker.is_consequence(v):
                self.result.consequences += 1
                continue
            checker.taint(v)
            finding = Finding(
                v,
                step.number,
                self.world.tick,
                step.text,
                drain,
                tuple(list(self.world.trace)[-self.config.trace_lines :]),
            )
            stop = v.cause == self.config.stop_on
            if v.cause in self.config.allowed and not stop:
                self.result.known_counts[v.cause] += 1
                self.result.known.setdefault(v.cause, finding)
                continue
            self.result.fatal = finding
            return False
        return True

    async def main_phase(self) -> bool:
        world = self.world
        for _ in range(self.config.steps):
            step = await world.run_step(world.choose())
            self.result.steps_run += 1
            self.traced()
            if not self.handle(await world.checker.after_step(step, world.now), step, False):
                return False
            if self.config.pause_s:
                await asyncio.sleep(self.config.pause_s)
        return True

    async def drain(self) -> None:
        """Everything in flight arrives, the stalled resume, then sweeps and truthful,
        immediate probes only, until nothing is in doubt (or the tick budget is spent).
        No operator: whatever is still in doubt after this is stuck."""
        world = self.world
        ticks = 0
        cycle = 0
        for _ in range(DRAIN_MAX_STEPS):
            kind, cycling = self.next_drain_kind(cycle)
            if kind is None:
                break
            if kind == "advance":
                ticks += 1
                if ticks > DRAIN_MAX_TICKS:
                    break
            cycle += cycling
            world.step_number += 1
            world.step = StepInfo(world.step_number, f"drain-{kind}")
            await self.drain_action(kind)
            world.trace.append(
                f"{world.step_number:>7} t={world.tick:<5} {world.step.kind:<12} {world.step.text}"
            )
            self.result.drain_steps += 1
            self.traced()
            step = world.step
            if not self.handle(await world.checker.after_step(step, world.now), step, True):
                return
        self.handle(world.checker.liveness(), world.step, True)

    def next_drain_kind(self, cycle: int) -> tuple[str | None, bool]:
        """The next drain action, and whether it is one of the sweep/probe/advance cycle."""
        w = self.world
        if any(r.stalled for r in w.replicas.values()):
            return "unstall", False
        if w._unlanded():
            return "land", False
        if w._late_answers():
            return "respond", False
        if w._receivable():
            return "receive", False
        if w._sendable():
            return "send", False
        if w._deliverable_probes():
            return "probe_answer", False
        if w.probes:
            return "advance", False  # slow probe answers
        if w.pending:
            return "advance", False  # receipts waiting for their deadline or their proxy
        waiting = (tables.DISPATCHING, tables.UNKNOWN)  # CONFLICTING waits for an operator
        if not any(w.checker.by_id[i].state in waiting for i in w.checker.doubtful):
            return None, False
        return ("sweep", "probe", "advance")[cycle % 3], True

    async def drain_action(self, kind: str) -> None:
        w = self.world
        if kind == "unstall":
            replica = next(
                r for r in sorted(w.replicas.values(), key=lambda r: r.name) if r.stalled
            )
            replica.stalled = False
            w.note(f"{replica.name} resumes")
        elif kind == "land":
            w.land(w.dispatches[w._unlanded()[0]])
        elif kind == "respond":
            d = w.dispatches[w._late_answers()[0]]
            d.answer_at = w.now
            w.note(f"{d.name}: the upstream's answer {d.status} arrives")
        elif kind == "receive":
            await w.receive(w.dispatches[w._receivable()[0]])
        elif kind == "send":
            await w.send(w.dispatches[w._sendable()[0]])
        elif kind == "probe_answer":
            await w.answer_probe(w.probes.pop(w._deliverable_probes()[0]))
        elif kind == "advance":
            await w.do_advance(1)
        elif kind == "sweep":
            await w.do_sweep()
        elif kind == "probe":
            await w.do_probe(immediate=True, hostile=False)


async def run(config: RunConfig, postgres_database: str | None = None) -> RunResult:
    """One run on a fresh store: a SQLite file in a temporary directory, or a fresh
    schema in `postgres_database` (dropped at the end)."""
    started = time.perf_counter()
    cpu_started = time.process_time()
    result = RunResult(config)
    workdir: Path | None = None
    if config.backend == "sqlite":
        workdir = Path(tempfile.mkdtemp(prefix="fenceproxy-sim-"))
        store_url = driver.sqlite_url(workdir)
    else:
        assert postgres_database is not None, "the postgres backend needs a database URL"
        # Durability is not under test: commits need not wait for the WAL flush.
        store_url = driver.ahead_of_pg_catalog(
            await backends.create_schema_async(postgres_database)
        )
        store_url += "&synchronous_commit=off"
    authority = Authority(config.backend, store_url)
    authority.sim_time = T0
    replicas = {name: Replica(authority, name) for name in REPLICAS}
    tables_ = Tables(config.backend, store_url)
    try:
        await authority.open()
        for replica in replicas.values():
            await replica.start()
        await tables_.open()
        upstream = SimUpstream()
        checker = Checker(tables_, upstream, config.evidence)
        world = World(
            seed=config.seed,
            evidence=config.evidence,
            authority=authority,
            checker=checker,
            upstream=upstream,
            policy=sim_policy(),
            replicas={},
            rng=random.Random(f"{config.seed}:{config.evidence.value}"),
            receipt_paths=random.Random(f"{config.seed}:{config.evidence.value}:receipts"),
            cancellations=config.cancellations,
        )
        world.replicas = {name: ReplicaState(name, r) for name, r in replicas.items()}
        run_ = Run(config, world, result)
        if await run_.main_phase():
            await run_.drain()
        result.effects = world.seq
        result.reads_overtaken = checker.reads_overtaken
        result.upstream_requests = upstream.requests
        result.receipts_by_path = world.receipts_by_path
        result.cancellations = world.cancelled_receipts
        result.trace_digest = run_.digest.hexdigest()
        for (resource, key), seqs in sorted(upstream.applied_keys.items()):
            if len(seqs) > 1 and not world.route_of(resource).upstream_idempotent:
                # Untracked in a hostile run: the store believed a lie (an untrue 4xx, a
                # wrong "not committed"); in a truthful run I2 would have failed the run.
                cause = checker.tainted.get(f"{resource}/{key}", "believed-untrue-evidence")
                result.double_effects[cause] += 1
    finally:
        await tables_.close()
        for replica in replicas.values():
            await replica.stop()
        await authority.close()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        elif postgres_database is not None:
            await _drop_schema(postgres_database, store_url)
    result.elapsed_s = time.perf_counter() - started
    result.cpu_s = time.process_time() - cpu_started
    return result


async def _drop_schema(database_url: str, store_url: str) -> None:
    schema = store_url.rsplit("search_path=", 1)[-1].partition("&")[0]
    assert schema.startswith(backends.SCHEMA_PREFIX), schema
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()
