# GENERATED from client/fenceproxy_client/_async.py by devtools/unasync_client.py: do not edit.
# Change the async source and run `make unasync`; `make lint` fails while this
# file differs from what the generator writes.
"""The synchronous client: `FenceClient` and its `Lease`, renewed by a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import httpx

from fenceproxy_client import errors
from fenceproxy_client._common import (
    API,
    LEASE_GONE,
    RETRIED_WHEN_WAITING,
    SETTLE_POLL_S,
    SETTLED_STATES,
    Cert,
    EffectStatus,
    Grant,
    LeaseNeeds,
    LeaseState,
    Step,
    Verify,
    bearer,
    checked,
    fenced_headers,
    logger,
    reader_headers,
    retry_delay,
    tls_settings,
)

# Called once when the lease is known lost, from the renewer's thread or the caller's.
OnLost = Callable[[], object]


class FenceClient:
    """A connection to one fenceproxy; thread-safe, and a context manager (closes)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        admin_token: str | None = None,
        api_key: str | None = None,
        verify: Verify = True,
        cert: Cert | None = None,
        trust_env: bool = False,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._admin_token = admin_token
        # The client key goes on lease calls and reads only, never on a fenced
        # write: that would hand it to the upstream.
        self._api_key = api_key
        self._needs = LeaseNeeds()
        # No retries at any layer: a write the client sent twice could happen twice.
        # The environment's proxies (HTTP_PROXY, ...) and .netrc are ignored unless
        # asked for: the sidecar is local, and every call carries a lease's token.
        self._http = httpx.Client(
            base_url=base_url,
            timeout=timeout_s,
            verify=tls_settings(verify, cert, trust_env),
            transport=transport,
            trust_env=trust_env,
        )

    def __repr__(self) -> str:
        return f"FenceClient({str(self._http.base_url)!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> FenceClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def lease(
        self,
        resource: str,
        holder: str,
        *,
        ttl_s: float | None = None,
        wait_s: float = 0.0,
        renew: bool = False,
        progress_timeout_s: float | None = None,
        on_lost: OnLost | None = None,
    ) -> LeaseScope:
        """A context manager: acquires on entry, releases (and stops renewing) on exit.

        No `cancel_on_lost` here: a thread cannot be cancelled from outside. Call
        `lease.check()` between steps (it raises `errors.LeaseLost`), or pass `on_lost`."""
        return LeaseScope(
            lambda: self.acquire(
                resource,
                holder,
                ttl_s=ttl_s,
                wait_s=wait_s,
                renew=renew,
                progress_timeout_s=progress_timeout_s,
                on_lost=on_lost,
            ),
        )

    def acquire(
        self,
        resource: str,
        holder: str,
        *,
        ttl_s: float | None = None,
        wait_s: float = 0.0,
        renew: bool = False,
        progress_timeout_s: float | None = None,
        on_lost: OnLost | None = None,
    ) -> Lease:
        """Acquire a lease; with `wait_s > 0`, wait out `lease_held`, `resource_blocked`
        (and `rate_limited`) refusals for up to that long, honouring `Retry-After`, then
        raise the last refusal. `ttl_s=None` is the proxy's default ttl."""
        body: dict[str, Any] = {"resource": resource, "holder": holder}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        deadline = time.monotonic() + wait_s
        attempt = 0
        while True:
            sent_at = time.monotonic()
            response = self._http.post(f"{API}/leases", json=body, headers=bearer(self._api_key))
            try:
                checked(response, True, time.time())
            except errors.FenceError as refused:
                remaining = deadline - time.monotonic()
                if refused.code not in RETRIED_WHEN_WAITING or remaining <= 0:
                    raise
                time.sleep(min(retry_delay(refused, attempt), remaining))
                attempt += 1
                continue
            token = str(response.json()["token"])
            grant = Grant.read(response.json(), sent_at)
            return Lease(
                self, grant, token, ttl_s or grant.ttl_s, renew, progress_timeout_s, on_lost
            )

    def effect(self, effect_id: str) -> EffectStatus:
        """The effect as the proxy has it now, read with the admin token, else the client
        key (whose client needs the `read` right on the effect's resource)."""
        return self._effect(effect_id, reader_headers(self._admin_token, self._api_key))

    def wait_settled(self, effect_id: str, timeout_s: float) -> str:
        """Poll the effect (with the admin token) until reconciliation settles it:
        COMMITTED or NOT_COMMITTED. TimeoutError if it is still in doubt at `timeout_s`."""
        return self._wait_settled(
            effect_id, timeout_s, reader_headers(self._admin_token, self._api_key)
        )

    def _effect(self, effect_id: str, headers: dict[str, str]) -> EffectStatus:
        response = self._http.get(f"{API}/effects/{effect_id}", headers=headers)
        return EffectStatus.read(checked(response, True, time.time()).json())

    def _wait_settled(self, effect_id: str, timeout_s: float, headers: dict[str, str]) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            state = (self._effect(effect_id, headers)).state
            if state in SETTLED_STATES:
                return state
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"effect {effect_id} still {state} after {timeout_s:g} s")
            time.sleep(min(SETTLE_POLL_S, remaining))

    def _renew(self, token: str, ttl_s: float) -> Grant:
        sent_at = time.monotonic()
        response = self._http.post(
            f"{API}/leases/renew",
            json={"ttl_s": ttl_s},
            headers={"Fence-Token": token, **bearer(self._api_key)},
        )
        return Grant.read(checked(response, True, time.time()).json(), sent_at)

    def _release(self, token: str) -> None:
        response = self._http.post(
            f"{API}/leases/release",
            json={},
            headers={"Fence-Token": token, **bearer(self._api_key)},
        )
        checked(response, True, time.time())

    def _request(
        self, method: str, path: str, headers: dict[str, str], **kwargs: Any
    ) -> httpx.Response:
        return self._http.request(method, path, headers=headers, **kwargs)


class LeaseScope:
    """What `FenceClient.lease` returns: `with` acquires, and releases on the
    way out."""

    def __init__(
        self,
        acquire: Callable[[], Lease],
    ) -> None:
        self._acquire = acquire
        self._lease: Lease | None = None

    def __enter__(self) -> Lease:
        self._lease = self._acquire()
        return self._lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._lease is not None
        self._lease.__exit__(exc_type, exc, traceback)


class Lease:
    """A lease held through a `FenceClient`. `token` is the bearer secret: it is sent in
    `Fence-Token` and never shown by `repr` or in a log line."""

    def __init__(
        self,
        client: FenceClient,
        grant: Grant,
        token: str,
        ttl_s: float,
        renew: bool,
        progress_timeout_s: float | None,
        on_lost: OnLost | None,
    ) -> None:
        self._client = client
        self.token = token
        self._state = LeaseState(grant, ttl_s, renew, progress_timeout_s, time.monotonic())
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        if renew or on_lost is not None:
            self._renewer = threading.Thread(
                target=self._watch, name=f"fence-renew-{grant.resource}", daemon=True
            )
            self._renewer.start()

    @property
    def resource(self) -> str:
        return self._state.grant.resource

    @property
    def holder(self) -> str:
        return self._state.grant.holder

    @property
    def epoch(self) -> int:
        return self._state.grant.epoch

    @property
    def expires_at(self) -> float:
        """Unix time (the proxy's clock) the lease ends unless renewed."""
        return self._state.grant.expires_at

    @property
    def lost(self) -> bool:
        """True once the client knows the lease is gone: a renewal or a request was
        refused as stale or expired, or the lease's ttl ran out without a renewal."""
        return self._state.is_lost(time.monotonic())

    def __repr__(self) -> str:
        return f"Lease({self._state.describe()}, lost={self.lost})"

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Release; a lease already gone, or a proxy that cannot be reached, is logged,
        not raised: the lease ends at its expiry anyway."""
        try:
            self.release()
        except errors.FenceError as refused:
            if refused.code not in LEASE_GONE:
                raise
            logger.info("lease on %s was already gone at release: %s", self.resource, refused)
        except httpx.TransportError as failed:
            logger.warning(
                "lease on %s not released (%s); it ends at its expiry", self.resource, failed
            )

    def request(
        self,
        method: str,
        path: str,
        *,
        idempotency_key: str | None = None,
        raise_for_status: bool = True,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | str | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        """Send a request through the proxy with this lease's token.

        Raises the proxy's refusal as its `FenceError`, an upstream's non-2xx answer as
        `UpstreamError` (returned instead with `raise_for_status=False`). It is sent even
        when the lease looks lost here: the proxy decides, not this process's clock.

        Lease sizing: before the request, the lease is renewed when less would be left
        on it, once the request reaches the proxy, than the proxy said this method and
        path need (`needed_s` of an earlier `lease_too_short`); on `lease_too_short` it
        is renewed and the request sent once more (nothing reached the upstream).
        Nothing else is ever sent twice.
        """
        extra: dict[str, Any] = {"params": params, "json": json, "content": content}
        if timeout_s is not None:
            extra["timeout"] = timeout_s
        sent = fenced_headers(self.token, idempotency_key, headers)
        needs = self._client._needs
        if self._state.should_renew_for(needs.needed(method, path), time.monotonic()):
            self.renew()
        try:
            return self._send(method, path, sent, raise_for_status, extra)
        except errors.LeaseTooShort as refused:
            # Nothing was sent upstream, so sending once more after a renewal is safe.
            # A ttl shorter than the route needs cannot be helped by renewing.
            if not self._state.should_renew_for(
                needs.learn(method, path, refused), time.monotonic()
            ):
                raise
            self.renew()
        return self._send(method, path, sent, raise_for_status, extra)

    def _send(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        raise_for_status: bool,
        extra: dict[str, Any],
    ) -> httpx.Response:
        response = self._client._request(method, path, headers, **extra)
        try:
            return checked(response, raise_for_status, time.time())
        except errors.FenceError as refused:
            if refused.code in ("stale_epoch", "lease_expired"):
                self._lose(f"a request was refused: {refused.code}")
            raise

    def check(self) -> None:
        """Raise `errors.LeaseLost` if the lease is known to be gone (see `lost`): call
        it between steps of work that must not go on without the lease. The sync
        counterpart of client-go's OnStoppedLeading (a thread cannot be cancelled)."""
        self._state.check(time.monotonic())

    def progress(self) -> None:
        """Say the work is still moving; with `progress_timeout_s`, renewal stops when
        this has not been called for that long."""
        self._state.progress(time.monotonic())

    def renew(self, ttl_s: float | None = None) -> None:
        """Extend the lease by `ttl_s` (None: the ttl it was acquired with)."""
        try:
            grant = self._client._renew(self.token, ttl_s or self._state.ttl_s)
        except errors.FenceError as refused:
            if refused.code in LEASE_GONE:
                self._lose(f"renewal refused: {refused.code}")
            raise
        self._state.renewed(grant, time.monotonic())

    def release(self) -> None:
        """End the lease now and stop renewing it."""
        self._state.release()
        self._stop.set()
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join()
        self._client._release(self.token)

    def effect(self, effect_id: str) -> EffectStatus:
        """The effect as the proxy has it now, read with this lease's token (an effect on
        this lease's resource; also after the lease ended)."""
        return self._client._effect(effect_id, {"Fence-Token": self.token})

    def wait_settled(self, effect_id: str, timeout_s: float) -> str:
        """Poll an effect on this lease's resource (read with this lease's token) until
        reconciliation settles it: COMMITTED or NOT_COMMITTED. TimeoutError after
        `timeout_s`. Works after the lease ended, while the proxy keeps its record."""
        return self._client._wait_settled(effect_id, timeout_s, {"Fence-Token": self.token})

    def _lose(self, why: str) -> None:
        if self._state.lose(why):
            self._call_on_lost()

    def _call_on_lost(self) -> None:
        if self._on_lost is None:
            return
        try:
            self._on_lost()
        except Exception:
            logger.exception("on_lost of the lease on %s failed", self.resource)

    def _watch(self) -> None:
        """The renewer: renews at a third of the ttl while renewing, and tells on_lost
        when the lease is gone."""
        while True:
            step, wait_s = self._state.next_step(time.monotonic())
            if step is Step.DONE:
                return
            if step is Step.LOST:
                self._call_on_lost()
                return
            if step is Step.WAIT:
                if self._stop.wait(wait_s):
                    return
                continue
            try:
                self.renew()
            except errors.FenceError as refused:
                if refused.code in LEASE_GONE:
                    return
                logger.warning("renewal of the lease on %s failed: %s", self.resource, refused)
                self._state.renewal_failed(time.monotonic())
            except httpx.TransportError as failed:
                logger.warning("renewal of the lease on %s failed: %s", self.resource, failed)
                self._state.renewal_failed(time.monotonic())
