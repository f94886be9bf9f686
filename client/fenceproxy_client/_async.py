# unasync: async
"""The asyncio client: `AsyncFenceClient` and its `AsyncLease`, renewed by a task.

The source of the synchronous client (`_sync.py`), which devtools/unasync_client.py
writes from this file: edit here and run `make unasync`. `# unasync:` markers bracket
what differs beyond the token table: `async` lines are left out of the sync client,
and the commented lines of a `sync` block go in in their place."""
# unasync: sync
# """The synchronous client: `FenceClient` and its `Lease`, renewed by a background thread."""
# unasync: end

from __future__ import annotations

import asyncio
import contextlib
import inspect

# unasync: sync
# import threading
# unasync: end
import time
from collections.abc import Awaitable, Callable, Mapping
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

# unasync: async
# Called once when the lease is known lost; it may be a coroutine function.
AsyncOnLost = Callable[[], Awaitable[object] | object]
# unasync: sync
# # Called once when the lease is known lost, from the renewer's thread or the caller's.
# OnLost = Callable[[], object]
# unasync: end


class AsyncFenceClient:
    # unasync: async
    """`FenceClient` for asyncio: the same methods, awaited; an async context manager."""

    # unasync: sync
    # """A connection to one fenceproxy; thread-safe, and a context manager (closes)."""
    # unasync: end

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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._admin_token = admin_token
        # The client key goes on lease calls and reads only, never on a fenced
        # write: that would hand it to the upstream.
        self._api_key = api_key
        self._needs = LeaseNeeds()
        # No retries at any layer: a write the client sent twice could happen twice.
        # The environment's proxies (HTTP_PROXY, ...) and .netrc are ignored unless
        # asked for: the sidecar is local, and every call carries a lease's token.
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout_s,
            verify=tls_settings(verify, cert, trust_env),
            transport=transport,
            trust_env=trust_env,
        )

    def __repr__(self) -> str:
        return f"AsyncFenceClient({str(self._http.base_url)!r})"

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncFenceClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def lease(
        self,
        resource: str,
        holder: str,
        *,
        ttl_s: float | None = None,
        wait_s: float = 0.0,
        renew: bool = False,
        progress_timeout_s: float | None = None,
        on_lost: AsyncOnLost | None = None,
        # unasync: async
        cancel_on_lost: bool = False,
        # unasync: end
    ) -> AsyncLeaseScope:
        # unasync: async
        """An async context manager: acquires on entry, releases (and stops renewing)
        on exit. With `cancel_on_lost`, the block is a cancel scope: once the lease is
        known lost (seen by the renewer, or its ttl ran out), the task running the block
        is cancelled, and the `async with` raises `errors.LeaseLost` in its place."""
        # unasync: sync
        # """A context manager: acquires on entry, releases (and stops renewing) on exit.
        #
        # No `cancel_on_lost` here: a thread cannot be cancelled from outside. Call
        # `lease.check()` between steps (it raises `errors.LeaseLost`), or pass `on_lost`."""
        # unasync: end
        return AsyncLeaseScope(
            lambda: self.acquire(
                resource,
                holder,
                ttl_s=ttl_s,
                wait_s=wait_s,
                renew=renew,
                progress_timeout_s=progress_timeout_s,
                on_lost=on_lost,
            ),
            # unasync: async
            cancel_on_lost,
            # unasync: end
        )

    async def acquire(
        self,
        resource: str,
        holder: str,
        *,
        ttl_s: float | None = None,
        wait_s: float = 0.0,
        renew: bool = False,
        progress_timeout_s: float | None = None,
        on_lost: AsyncOnLost | None = None,
    ) -> AsyncLease:
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
            response = await self._http.post(
                f"{API}/leases", json=body, headers=bearer(self._api_key)
            )
            try:
                checked(response, True, time.time())
            except errors.FenceError as refused:
                remaining = deadline - time.monotonic()
                if refused.code not in RETRIED_WHEN_WAITING or remaining <= 0:
                    raise
                await asyncio.sleep(min(retry_delay(refused, attempt), remaining))
                attempt += 1
                continue
            token = str(response.json()["token"])
            grant = Grant.read(response.json(), sent_at)
            return AsyncLease(
                self, grant, token, ttl_s or grant.ttl_s, renew, progress_timeout_s, on_lost
            )

    async def effect(self, effect_id: str) -> EffectStatus:
        """The effect as the proxy has it now, read with the admin token, else the client
        key (whose client needs the `read` right on the effect's resource)."""
        return await self._effect(effect_id, reader_headers(self._admin_token, self._api_key))

    async def wait_settled(self, effect_id: str, timeout_s: float) -> str:
        """Poll the effect (with the admin token) until reconciliation settles it:
        COMMITTED or NOT_COMMITTED. TimeoutError if it is still in doubt at `timeout_s`."""
        return await self._wait_settled(
            effect_id, timeout_s, reader_headers(self._admin_token, self._api_key)
        )

    async def _effect(self, effect_id: str, headers: dict[str, str]) -> EffectStatus:
        response = await self._http.get(f"{API}/effects/{effect_id}", headers=headers)
        return EffectStatus.read(checked(response, True, time.time()).json())

    async def _wait_settled(self, effect_id: str, timeout_s: float, headers: dict[str, str]) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            state = (await self._effect(effect_id, headers)).state
            if state in SETTLED_STATES:
                return state
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"effect {effect_id} still {state} after {timeout_s:g} s")
            await asyncio.sleep(min(SETTLE_POLL_S, remaining))

    async def _renew(self, token: str, ttl_s: float) -> Grant:
        sent_at = time.monotonic()
        response = await self._http.post(
            f"{API}/leases/renew",
            json={"ttl_s": ttl_s},
            headers={"Fence-Token": token, **bearer(self._api_key)},
        )
        return Grant.read(checked(response, True, time.time()).json(), sent_at)

    async def _release(self, token: str) -> None:
        response = await self._http.post(
            f"{API}/leases/release",
            json={},
            headers={"Fence-Token": token, **bearer(self._api_key)},
        )
        checked(response, True, time.time())

    async def _request(
        self, method: str, path: str, headers: dict[str, str], **kwargs: Any
    ) -> httpx.Response:
        return await self._http.request(method, path, headers=headers, **kwargs)


class AsyncLeaseScope:
    """What `AsyncFenceClient.lease` returns: `async with` acquires, and releases on the
    way out."""

    def __init__(
        self,
        # unasync: async
        acquire: Callable[[], Awaitable[AsyncLease]],
        cancel_on_lost: bool = False,
        # unasync: sync
        # acquire: Callable[[], Lease],
        # unasync: end
    ) -> None:
        self._acquire = acquire
        # unasync: async
        self._cancel_on_lost = cancel_on_lost
        # unasync: end
        self._lease: AsyncLease | None = None

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._acquire()
        # unasync: async
        if self._cancel_on_lost:
            self._lease._cancel_when_lost(asyncio.current_task())
        # unasync: end
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._lease is not None
        # unasync: async
        # As asyncio.timeout does: the cancellation this scope asked for ends here, as
        # LeaseLost; any other (the caller's own) goes on.
        cancelled_here = self._lease._stop_cancelling()
        # unasync: end
        await self._lease.__aexit__(exc_type, exc, traceback)
        # unasync: async
        if cancelled_here and exc_type is asyncio.CancelledError:
            raise self._lease._lost_error() from exc
        # unasync: end


class AsyncLease:
    # unasync: async
    """`Lease` for asyncio; renewed by a task of the loop it was acquired on."""

    # unasync: sync
    # """A lease held through a `FenceClient`. `token` is the bearer secret: it is sent in
    # `Fence-Token` and never shown by `repr` or in a log line."""
    # unasync: end

    def __init__(
        self,
        client: AsyncFenceClient,
        grant: Grant,
        token: str,
        ttl_s: float,
        renew: bool,
        progress_timeout_s: float | None,
        on_lost: AsyncOnLost | None,
    ) -> None:
        self._client = client
        self.token = token
        self._state = LeaseState(grant, ttl_s, renew, progress_timeout_s, time.monotonic())
        self._on_lost = on_lost
        # unasync: async
        self._stop = asyncio.Event()
        # The task running a `cancel_on_lost` block, and whether it was cancelled.
        self._cancel_target: asyncio.Task[Any] | None = None
        self._cancelled_target = False
        self._renewer: asyncio.Task[None] | None = None
        if renew or on_lost is not None:
            self._renewer = asyncio.get_running_loop().create_task(
                self._watch(), name=f"fence-renew-{grant.resource}"
            )
        # unasync: sync
        # self._stop = threading.Event()
        # self._renewer: threading.Thread | None = None
        # if renew or on_lost is not None:
        #     self._renewer = threading.Thread(
        #         target=self._watch, name=f"fence-renew-{grant.resource}", daemon=True
        #     )
        #     self._renewer.start()
        # unasync: end

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
        return f"AsyncLease({self._state.describe()}, lost={self.lost})"

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Release; a lease already gone, or a proxy that cannot be reached, is logged,
        not raised: the lease ends at its expiry anyway."""
        try:
            await self.release()
        except errors.FenceError as refused:
            if refused.code not in LEASE_GONE:
                raise
            logger.info("lease on %s was already gone at release: %s", self.resource, refused)
        except httpx.TransportError as failed:
            logger.warning(
                "lease on %s not released (%s); it ends at its expiry", self.resource, failed
            )

    async def request(
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
            await self.renew()
        try:
            return await self._send(method, path, sent, raise_for_status, extra)
        except errors.LeaseTooShort as refused:
            # Nothing was sent upstream, so sending once more after a renewal is safe.
            # A ttl shorter than the route needs cannot be helped by renewing.
            if not self._state.should_renew_for(
                needs.learn(method, path, refused), time.monotonic()
            ):
                raise
            await self.renew()
        return await self._send(method, path, sent, raise_for_status, extra)

    async def _send(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        raise_for_status: bool,
        extra: dict[str, Any],
    ) -> httpx.Response:
        response = await self._client._request(method, path, headers, **extra)
        try:
            return checked(response, raise_for_status, time.time())
        except errors.FenceError as refused:
            if refused.code in ("stale_epoch", "lease_expired"):
                await self._lose(f"a request was refused: {refused.code}")
            raise

    def check(self) -> None:
        # unasync: async
        """Raise `errors.LeaseLost` if the lease is known to be gone (see `lost`): call
        it between steps of work that must not go on without the lease, or let
        `lease(..., cancel_on_lost=True)` cancel the block."""
        # unasync: sync
        # """Raise `errors.LeaseLost` if the lease is known to be gone (see `lost`): call
        # it between steps of work that must not go on without the lease. The sync
        # counterpart of client-go's OnStoppedLeading (a thread cannot be cancelled)."""
        # unasync: end
        self._state.check(time.monotonic())

    def progress(self) -> None:
        """Say the work is still moving; with `progress_timeout_s`, renewal stops when
        this has not been called for that long."""
        self._state.progress(time.monotonic())

    async def renew(self, ttl_s: float | None = None) -> None:
        """Extend the lease by `ttl_s` (None: the ttl it was acquired with)."""
        try:
            grant = await self._client._renew(self.token, ttl_s or self._state.ttl_s)
        except errors.FenceError as refused:
            if refused.code in LEASE_GONE:
                await self._lose(f"renewal refused: {refused.code}")
            raise
        self._state.renewed(grant, time.monotonic())

    async def release(self) -> None:
        """End the lease now and stop renewing it."""
        self._state.release()
        self._stop.set()
        renewer = self._renewer
        # unasync: async
        if renewer is not None and renewer is not asyncio.current_task():
            await renewer
        # unasync: sync
        # if renewer is not None and renewer is not threading.current_thread():
        #     renewer.join()
        # unasync: end
        await self._client._release(self.token)

    async def effect(self, effect_id: str) -> EffectStatus:
        """The effect as the proxy has it now, read with this lease's token (an effect on
        this lease's resource; also after the lease ended)."""
        return await self._client._effect(effect_id, {"Fence-Token": self.token})

    async def wait_settled(self, effect_id: str, timeout_s: float) -> str:
        """Poll an effect on this lease's resource (read with this lease's token) until
        reconciliation settles it: COMMITTED or NOT_COMMITTED. TimeoutError after
        `timeout_s`. Works after the lease ended, while the proxy keeps its record."""
        return await self._client._wait_settled(effect_id, timeout_s, {"Fence-Token": self.token})

    async def _lose(self, why: str) -> None:
        if self._state.lose(why):
            await self._call_on_lost()

    # unasync: async
    def _cancel_when_lost(self, task: asyncio.Task[Any] | None) -> None:
        self._cancel_target = task
        if self._renewer is None:  # not renewed: watched only to tell when it expires
            self._renewer = asyncio.get_running_loop().create_task(
                self._watch(), name=f"fence-renew-{self.resource}"
            )

    def _stop_cancelling(self) -> bool:
        """Detach the block's task; True if it was cancelled for the lost lease (that
        cancellation request is withdrawn: it is answered by LeaseLost instead)."""
        target, self._cancel_target = self._cancel_target, None
        if self._cancelled_target and target is not None:
            target.uncancel()
            return True
        return False

    def _lost_error(self) -> errors.LeaseLost:
        try:
            self._state.check(time.monotonic())
        except errors.LeaseLost as lost:
            return lost
        return errors.LeaseLost(self.resource, self.epoch, "lost")

    # unasync: end
    async def _call_on_lost(self) -> None:
        # unasync: async
        # The block's own task learns it from the refusal it is raising; cancelling it
        # as well would leave a stray cancellation on it.
        target = self._cancel_target
        if target is not None and target is not asyncio.current_task() and not target.done():
            self._cancelled_target = True
            target.cancel(f"the lease on {self.resource} is lost")
        # unasync: end
        if self._on_lost is None:
            return
        try:
            # unasync: async
            result = self._on_lost()
            if inspect.isawaitable(result):
                await result
            # unasync: sync
            # self._on_lost()
            # unasync: end
        except Exception:
            logger.exception("on_lost of the lease on %s failed", self.resource)

    async def _watch(self) -> None:
        """The renewer: renews at a third of the ttl while renewing, and tells on_lost
        when the lease is gone."""
        while True:
            step, wait_s = self._state.next_step(time.monotonic())
            if step is Step.DONE:
                return
            if step is Step.LOST:
                await self._call_on_lost()
                return
            if step is Step.WAIT:
                # unasync: async
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), wait_s)
                if self._stop.is_set():
                    return
                # unasync: sync
                # if self._stop.wait(wait_s):
                #     return
                # unasync: end
                continue
            try:
                await self.renew()
            except errors.FenceError as refused:
                if refused.code in LEASE_GONE:
                    return
                logger.warning("renewal of the lease on %s failed: %s", self.resource, refused)
                self._state.renewal_failed(time.monotonic())
            except httpx.TransportError as failed:
                logger.warning("renewal of the lease on %s failed: %s", self.resource, failed)
                self._state.renewal_failed(time.monotonic())
