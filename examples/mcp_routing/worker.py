"""A worker process of the MCP routing example: claims jobs and writes rules under a lease.

Started by the server's supervisor (never by hand): ``python -m
examples.mcp_routing.worker --proxy URL --state DIR --name NAME ...``. For each job
it claims, it takes the lease on ``rule:{rule_id}`` through the fenceproxy client,
reads the rule through the proxy, writes it back with the new ``route_to`` under the
lease's token, and records the outcome. It never decides on its own clock that its
lease is gone: the proxy does, and a refused write is recorded as what it is.

A worker exits when its parent (the server) is gone, or after finishing a job whose
claim turned out to be stale: the supervisor has already started its replacement.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
from fenceproxy_client import FenceClient, Lease, errors

from examples.mcp_routing.jobs import (
    ANSWER_LOST,
    BLOCKED,
    DONE,
    FAILED,
    PENDING,
    Claim,
    JobStore,
    Outcome,
)

IDLE_POLL_S: Final = 0.1

# Test hook: a worker holding this claim generation stops itself (a real SIGSTOP) after
# recording phase "writing" and before sending its write, so a test can reproduce a
# worker stalled at exactly that point without racing it. Unset in normal use.
STOP_BEFORE_WRITE_ENV: Final = "MCP_ROUTING_STOP_BEFORE_WRITE_GENERATION"

# Refusals after which the job is simply tried again under a new claim and lease: the
# lease was lost or not had, or the proxy sent nothing upstream. (Not store_unavailable:
# after a write, it says the write may have taken effect.)
RETRIED_CODES: Final = frozenset(
    {"stale_epoch", "lease_expired", "lease_held", "upstream_unreachable", "overloaded"}
)

# The only transport errors that prove a request never left this process: no connection
# was made (refused, timed out, none free in the pool). Any other (a reset, a read
# timeout, a connection closed before the answer) may come after the proxy forwarded
# the write and recorded it applied.
NOTHING_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Between two sends of a write whose answer was lost.
RESEND_PAUSE_S: Final = 0.2

log = logging.getLogger("mcp_routing.worker")


@dataclass(frozen=True)
class ProxyAccess:
    """How a process of the example reaches fenceproxy: its URL, and where `auth:` or
    TLS is on, the client key (read from the environment variable named here, never
    put on a command line) and the CA bundle and client certificate."""

    url: str
    api_key_env: str | None = None
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    def argv(self) -> list[str]:
        """The same, as the command-line options that `add_arguments` reads."""
        options = {
            "--proxy": self.url,
            "--api-key-env": self.api_key_env,
            "--ca-bundle": self.ca_bundle,
            "--client-cert": self.client_cert,
            "--client-key": self.client_key,
        }
        return [part for name, value in options.items() if value for part in (name, value)]

    def client_options(self) -> dict[str, Any]:
        """FenceClient's keyword arguments (and httpx's `verify`, as it spells them)."""
        options: dict[str, Any] = {}
        if self.api_key_env:
            options["api_key"] = os.environ[self.api_key_env]
        if self.ca_bundle:
            options["verify"] = self.ca_bundle
        if self.client_cert:
            options["cert"] = (
                (self.client_cert, self.client_key) if self.client_key else self.client_cert
            )
        return options

    def ssl_context(self) -> ssl.SSLContext | bool:
        """httpx's `verify` for a plain request to the proxy (not through the client)."""
        if not self.ca_bundle and not self.client_cert:
            return True
        context = ssl.create_default_context(cafile=self.ca_bundle)
        if self.client_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--proxy", required=True, help="fenceproxy's URL")
        parser.add_argument(
            "--api-key-env", help="environment variable holding the client key (auth:)"
        )
        parser.add_argument("--ca-bundle", help="CA bundle (PEM) the proxy's certificate is from")
        parser.add_argument("--client-cert", help="client certificate (PEM) for mutual TLS")
        parser.add_argument("--client-key", help="its private key (PEM), if not in the cert file")

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> ProxyAccess:
        return cls(
            args.proxy.rstrip("/"),
            args.api_key_env,
            args.ca_bundle,
            args.client_cert,
            args.client_key,
        )


@dataclass(frozen=True)
class WorkerSettings:
    proxy: ProxyAccess
    state_dir: Path
    name: str
    lease_ttl_s: float
    lease_wait_s: float
    claim_ttl_s: float
    http_timeout_s: float
    settle_wait_s: float
    blocked_recheck_s: float


def outcome_of_refusal(refusal: errors.FenceError) -> Outcome:
    if isinstance(refusal, errors.OutcomeUnknown):
        # Still unsettled after the worker's wait: never resent under a new attempt.
        # The proxy holds the resource until the effect is settled (see the operator's
        # runbook, docs/how-to/reconciliation.md); the effect id is here for the operator.
        return Outcome(
            refusal.code, BLOCKED, f"effect {refusal.effect_id} in doubt", refusal.effect_id
        )
    if isinstance(refusal, errors.ResourceBlocked):
        return Outcome(refusal.code, BLOCKED, f"effects in doubt: {list(refusal.effect_ids)}")
    if refusal.code in RETRIED_CODES:
        return Outcome(refusal.code, PENDING, refusal.detail)
    return Outcome(refusal.code, FAILED, refusal.detail)


def outcome_of_settlement(effect_id: str, state: str) -> Outcome:
    """What the proxy's settlement of a write in doubt means for the job."""
    if state == "COMMITTED":
        return Outcome("written", DONE, f"effect {effect_id} settled COMMITTED")
    # NOT_COMMITTED (or NOT_SENT): the write did not happen, so the job may run again,
    # from a fresh read under a new lease.
    return Outcome(state.lower(), PENDING, f"effect {effect_id} settled {state}")


def _await_settlement(
    lease: Lease, store: JobStore, claim: Claim, settings: WorkerSettings, effect_id: str
) -> Outcome:
    """Wait up to `settle_wait_s` for the proxy to settle the job's write `effect_id`,
    never resending it. The claim is extended meanwhile: the worker is alive and on the
    job."""
    deadline = time.monotonic() + settings.settle_wait_s
    while (remaining := deadline - time.monotonic()) > 0:
        if not store.progress(claim, settings.claim_ttl_s, phase="settling"):
            break  # replaced meanwhile: the job is its successor's now
        try:
            state = lease.wait_settled(effect_id, min(remaining, settings.claim_ttl_s / 3))
        except TimeoutError:
            continue
        except httpx.TransportError as exc:
            # The write is still in doubt, whatever became of the proxy: never "nothing
            # was done". Asked again until the wait is over, then the job blocks.
            log.warning("effect %s: its settlement could not be read: %s", effect_id, exc)
            time.sleep(min(RESEND_PAUSE_S, remaining))
            continue
        return outcome_of_settlement(effect_id, state)
    return _blocked_with_schedule(lease, effect_id)


def _blocked_with_schedule(lease: Lease, effect_id: str) -> Outcome:
    """The job blocks on its write in doubt; its result carries when the proxy probes it
    next (or that no probe will), so the job can say how it will be settled."""
    blocked = Outcome("outcome_unknown", BLOCKED, f"effect {effect_id} in doubt", effect_id)
    try:
        effect = lease.effect(effect_id)
    except (errors.FenceError, httpx.TransportError) as exc:
        log.warning("effect %s: its probe schedule could not be read: %s", effect_id, exc)
        return blocked
    return dataclasses.replace(blocked, probe_schedule={"next_probe_at": effect.next_probe_at})


def _read_rule(lease: Lease, path: str) -> dict[str, Any]:
    """The rule as the upstream has it now; {} when it has none yet (404)."""
    try:
        response: httpx.Response = lease.request("GET", path)
    except errors.UpstreamError as exc:
        if exc.response.status_code == httpx.codes.NOT_FOUND:
            return {}
        raise
    rule: dict[str, Any] = response.json()["rule"]
    return rule


def _stop_here_if_asked(claim: Claim) -> None:
    if os.environ.get(STOP_BEFORE_WRITE_ENV) == str(claim.generation):
        log.info("test hook: stopping before the write of job %s", claim.job_id)
        os.kill(os.getpid(), signal.SIGSTOP)


def _read_and_write(
    lease: Lease, store: JobStore, claim: Claim, settings: WorkerSettings
) -> Outcome:
    """One read-modify-write under the lease; every answer becomes an Outcome."""
    path = f"/rules/{claim.rule_id}"
    try:
        store.progress(claim, settings.claim_ttl_s, phase="leased", epoch=lease.epoch)
        rule = _read_rule(lease, path)
        lease.progress()  # the same steps keep the lease renewed and the claim alive
        store.progress(claim, settings.claim_ttl_s, phase="writing", rule_read=rule)
    except errors.FenceError as refusal:
        return outcome_of_refusal(refusal)
    except errors.UpstreamError as exc:
        return Outcome("upstream_error", FAILED, f"upstream answered {exc.response.status_code}")
    except httpx.TransportError as exc:
        # Nothing was written yet: the job starts again from a fresh read.
        return Outcome("proxy_unreachable", PENDING, type(exc).__name__)
    _stop_here_if_asked(claim)
    # Deliberately no check of lease.lost or of the claim here: only the proxy can
    # tell whether this lease is still the resource's current one.
    body = {
        **rule,
        "route_to": claim.route_to,
        "written_by": {"job": claim.job_id, "worker": claim.worker, "epoch": lease.epoch},
    }
    return write_rule(lease, store, claim, settings, path, body)


def write_rule(
    lease: Lease,
    store: JobStore,
    claim: Claim,
    settings: WorkerSettings,
    path: str,
    body: dict[str, Any],
) -> Outcome:
    """PUT the rule under the job's id as its Idempotency-Key, and make the answer an
    Outcome. The key is what makes a lost answer safe to ask about: the same request
    sent again is answered from the proxy's record of the first (replayed if it was
    applied, `request_in_progress` while it is forwarded, blocked while it is in doubt),
    and forwarded only if the first was not applied; a later attempt of the job (another
    body, under its own lease) is refused `idempotency_key_reused` with the first one's
    effect id, never applied over a newer job's write."""
    lost: str | None = None  # why an earlier send of this write is unaccounted for
    deadline = time.monotonic() + settings.settle_wait_s
    while True:
        try:
            written = lease.request("PUT", path, json=body, idempotency_key=claim.job_id)
        except errors.OutcomeUnknown as doubt:
            log.info("job %s: write in doubt (effect %s)", claim.job_id, doubt.effect_id)
            return _await_settlement(lease, store, claim, settings, doubt.effect_id)
        except (errors.RequestInProgress, errors.IdempotencyKeyReused) as earlier:
            # The key is this job's: the proxy names a write of this job it already has
            # (an earlier send whose answer was lost), which the job follows.
            effect_id = str(earlier.problem.get("effect_id", ""))
            log.info("job %s: its key names effect %s (%s)", claim.job_id, effect_id, earlier.code)
            return _await_settlement(lease, store, claim, settings, effect_id)
        except errors.UpstreamError as exc:
            return Outcome(
                "upstream_error", FAILED, f"upstream answered {exc.response.status_code}"
            )
        except errors.FenceError as refusal:
            if lost is None:
                return outcome_of_refusal(refusal)
            # Refused before anything was forwarded: the first send is still unaccounted
            # for, and the proxy's record of the key settles it.
            return _answer_lost(lost, f"asking again was refused: {refusal.code}")
        except httpx.TransportError as exc:
            if lost is None and isinstance(exc, NOTHING_SENT):
                return Outcome("proxy_unreachable", PENDING, type(exc).__name__)
            if lost is None:
                lost = f"the answer to the write was lost ({type(exc).__name__})"
                log.info("job %s: %s; asking again under its key", claim.job_id, lost)
                continue  # asked at once: the proxy has its record already
            if time.monotonic() >= deadline or not store.progress(
                claim, settings.claim_ttl_s, phase="asking"
            ):
                return _answer_lost(lost, "no answer to asking again either")
            time.sleep(RESEND_PAUSE_S)
            continue
        version = written.json().get("version")
        epoch = written.headers.get("Fence-Epoch", str(lease.epoch))
        if written.headers.get("Idempotent-Replayed") == "true":
            return Outcome(
                "written",
                DONE,
                f"version {version} under epoch {epoch} (replayed by the proxy from its"
                " record of an earlier send, whose answer was lost)",
            )
        return Outcome("written", DONE, f"version {version} under epoch {epoch}")


def _answer_lost(lost: str, why: str) -> Outcome:
    """The job's write may or may not have been applied, and the proxy could not be
    asked now: the job blocks until nothing on the rule is in doubt, then runs again
    under its key, which the proxy answers from its record of the first send."""
    return Outcome(ANSWER_LOST, BLOCKED, f"{lost}; {why}")


def run_job(
    client: FenceClient, store: JobStore, claim: Claim, settings: WorkerSettings
) -> Outcome:
    outcome: Outcome | None = None
    try:
        with client.lease(
            f"rule:{claim.rule_id}",
            claim.worker,
            ttl_s=settings.lease_ttl_s,
            wait_s=settings.lease_wait_s,
            renew=True,
            # Renewal stops with the work: after as long without progress as the claim
            # allows, the lease is left to run out too.
            progress_timeout_s=settings.claim_ttl_s,
        ) as lease:
            log.info(
                "job %s: lease on rule:%s at epoch %s", claim.job_id, claim.rule_id, lease.epoch
            )
            outcome = _read_and_write(lease, store, claim, settings)
    except errors.FenceError as refusal:
        # From the acquisition (nothing was sent) or from the release at the end of the
        # block, which cannot change what the write's answer already said.
        if outcome is None:
            return outcome_of_refusal(refusal)
        log.info("job %s: release refused (%s)", claim.job_id, refusal.code)
    except httpx.TransportError as exc:
        if outcome is None:
            return Outcome("proxy_unreachable", PENDING, type(exc).__name__)
        log.info("job %s: release not answered (%s)", claim.job_id, type(exc).__name__)
    if outcome is None:
        raise RuntimeError("the lease block ended without an outcome or an error")
    return outcome


def run_attempt(
    client: FenceClient, store: JobStore, claim: Claim, settings: WorkerSettings
) -> Outcome:
    """The job's attempt; whatever the worker raises ends the attempt with its reason
    (the lease was released on the way out), rather than the process."""
    try:
        return run_job(client, store, claim, settings)
    except Exception as exc:
        log.exception("job %s: the worker failed", claim.job_id)
        return Outcome("worker_error", PENDING, f"{type(exc).__name__}: {exc}")


def run(settings: WorkerSettings) -> int:
    store = JobStore(settings.state_dir, blocked_recheck_s=settings.blocked_recheck_s)
    parent = os.getppid()
    try:
        with FenceClient(
            settings.proxy.url,
            timeout_s=settings.http_timeout_s,
            **settings.proxy.client_options(),
        ) as client:
            # Orphaned (the server died without stopping us): stop taking jobs.
            while os.getppid() == parent:
                claim = store.claim(settings.name, os.getpid(), settings.claim_ttl_s)
                if claim is None:
                    time.sleep(IDLE_POLL_S)
                    continue
                log.info("claimed job %s (generation %d)", claim.job_id, claim.generation)
                outcome = run_attempt(client, store, claim, settings)
                log.info("job %s: %s (%s)", claim.job_id, outcome.outcome, outcome.detail)
                if not store.finish(claim, outcome):
                    log.info(
                        "job %s was claimed again meanwhile: this worker was replaced", claim.job_id
                    )
                    return 0
    finally:
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.mcp_routing.worker")
    ProxyAccess.add_arguments(parser)
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--lease-ttl", type=float, required=True)
    parser.add_argument("--lease-wait", type=float, required=True)
    parser.add_argument("--claim-ttl", type=float, required=True)
    parser.add_argument("--http-timeout", type=float, required=True)
    parser.add_argument("--settle-wait", type=float, required=True)
    parser.add_argument("--blocked-recheck", type=float, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {args.name} pid {os.getpid()}: %(message)s"
    )
    return run(
        WorkerSettings(
            proxy=ProxyAccess.from_arguments(args),
            state_dir=args.state,
            name=args.name,
            lease_ttl_s=args.lease_ttl,
            lease_wait_s=args.lease_wait,
            claim_ttl_s=args.claim_ttl,
            http_timeout_s=args.http_timeout,
            settle_wait_s=args.settle_wait,
            blocked_recheck_s=args.blocked_recheck,
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
