"""Reading the policy file again in a running proxy (`POST /_fence/v1/admin/reload`,
`fenceproxy reload`, SIGHUP): checked as `check-config` checks it, then swapped in
with no wait between the policy and the credentials made from its clients, or
refused with nothing changed (the rules: policies/reloading.py).

A request takes the policy and the credentials once, at its start (proxy/app.py
proxy_handler, proxy/auth.py take_credentials), and keeps them to its end; so one in
flight during a swap finishes as it began, under the client it was, and its
upstream's session stays open until it is done. A client removed keeps its leases
(ended as any lease is: expiry, release, revoke), but its token no longer renews nor
writes (core/fencing.py check_standing), and its key is refused.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from core.records import EffectRecord
from policies import ConfigError, Upstream, load_policy_with_digest
from policies.reloading import (
    Unsettled,
    auth_taken_away,
    restart_changes,
    stranded,
    stranding_changes,
)
from proxy import operations
from proxy.auth import KeyProblem
from proxy.runtime import Runtime, Upstreams
from reconcile import operations as reconciliation
from store import StoreError

log = logging.getLogger("fenceproxy")

# More effects in doubt than this and the reload is refused rather than half checked.
MAX_UNSETTLED_CHECKED = 100_000


class ReloadRefused(Exception):
    """Nothing was changed; the message says why, in one line."""


@dataclass(frozen=True)
class Reloaded:
    file: str
    digest: str
    previous_digest: str | None

    @property
    def changed(self) -> bool:
        return self.digest != self.previous_digest

    def as_json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "digest": self.digest,
            "previous_digest": self.previous_digest,
            "changed": self.changed,
        }


async def reload_policy(runtime: Runtime, upstreams: Upstreams) -> Reloaded:
    """Read the file again and serve it from the next request on; raise ReloadRefused
    (logged) when it is invalid, changes what needs a restart, or would strand an
    effect in doubt."""
    try:
        reloaded = await _reload(runtime, upstreams)
    except ReloadRefused as refused:
        runtime.metrics.count_reload("refused")
        log.error("policy reload refused: %s", refused)
        raise
    runtime.metrics.count_reload("reloaded")
    log.info(
        "policy reloaded from %s: sha256 %s%s",
        reloaded.file,
        reloaded.digest,
        "" if reloaded.changed else " (unchanged)",
    )
    return reloaded


async def _reload(runtime: Runtime, upstreams: Upstreams) -> Reloaded:
    async with runtime.reload_lock:
        path = runtime.policy_file
        if path is None:
            raise ReloadRefused("this proxy was not started from a policy file")
        try:
            policy, digest = load_policy_with_digest(path)
        except ConfigError as exc:
            problems = "; ".join(str(exc).splitlines()) or f"{path}: cannot be read"
            raise ReloadRefused(f"{problems} (nothing was changed)") from None
        if runtime.adjust is not None:
            policy = runtime.adjust(policy)
        old = runtime.policy
        fixed = restart_changes(old, policy)
        if fixed:
            raise ReloadRefused(
                f"{path}: {', '.join(fixed)} cannot change without a restart (nothing was changed)"
            )
        unguarded = auth_taken_away(old, policy)
        if unguarded is not None:
            raise ReloadRefused(f"{path}: {unguarded} (nothing was changed)")
        try:
            credentials = runtime.keyring.made_for(policy)
        except KeyProblem as exc:
            raise ReloadRefused(f"{path}: {exc} (nothing was changed)") from None
        taken = stranding_changes(old, policy)
        if taken:
            await _refuse_stranding(runtime, path, taken)
        retired = upstreams.pools.update(policy.upstreams.values())
        before = runtime.generation
        # The swap: a frozen policy and its credentials, with no wait between them;
        # requests read both once, at start.
        runtime.policy = policy
        runtime.keyring.current = credentials
        runtime.generation = before + 1
        previous, runtime.policy_digest = runtime.policy_digest, digest
        if runtime.reconciler is not None:
            runtime.reconciler.policy = policy
            runtime.reconciler.policy_digest = digest
            # Its row says the new digest at its next round, not after the interval.
            runtime.reconciler.last_beat = None
        runtime.metrics.watch_leases(
            runtime.store,
            tuple(route.resource_glob for route in operations.fenced_routes(policy)),
        )
        runtime.metrics.serve_policy(digest)
        if retired or taken:
            task = asyncio.create_task(
                _after_drain(runtime, upstreams, retired, taken, before), name="reload-drain"
            )
            runtime.draining.add(task)
            task.add_done_callback(runtime.draining.discard)
        return Reloaded(path, digest, previous)


async def _refuse_stranding(runtime: Runtime, path: str, taken: dict[str, str]) -> None:
    try:
        effects = await reconciliation.unsettled(runtime.store, MAX_UNSETTLED_CHECKED)
    except StoreError as exc:
        raise ReloadRefused(
            f"{path}: routes {', '.join(sorted(taken))} lose their route or probe, and the "
            f"store did not say which effects are in doubt ({exc}); nothing was changed"
        ) from None
    if len(effects) >= MAX_UNSETTLED_CHECKED:
        raise ReloadRefused(
            f"{path}: more than {MAX_UNSETTLED_CHECKED} effects are in doubt; settle them "
            "before taking a route or a probe away (nothing was changed)"
        )
    phrases = stranded(taken, (_unsettled(effect) for effect in effects))
    if phrases:
        raise ReloadRefused(
            f"{path}: the change would leave effects in doubt with no route or probe to "
            f"settle them: {'; '.join(phrases)}; settle them first (fenceproxy reconcile) "
            "(nothing was changed)"
        )


def _unsettled(effect: EffectRecord) -> Unsettled:
    return Unsettled(effect.id, effect.route, effect.resource, effect.state.value)


async def _after_drain(
    runtime: Runtime,
    upstreams: Upstreams,
    retired: list[Upstream],
    taken: dict[str, str],
    generation: int,
) -> None:
    """Once the requests that started before the reload are done: close the sessions it
    retired, and name any effect one of them left in doubt on a route it took away
    (the check before the swap could not see it; an operator settles it)."""
    await runtime.wait_for_generation(generation)
    await upstreams.pools.close_retired(retired)
    if not taken:
        return
    try:
        effects = await reconciliation.unsettled(runtime.store, MAX_UNSETTLED_CHECKED)
    except StoreError as exc:
        log.warning("after the policy reload, effects in doubt could not be listed: %s", exc)
        return
    phrases = stranded(taken, (_unsettled(effect) for effect in effects))
    if phrases:
        log.warning(
            "requests that started before the policy reload left effects in doubt with no "
            "route or probe: %s; settle them with fenceproxy reconcile resolve",
            "; ".join(phrases),
        )
