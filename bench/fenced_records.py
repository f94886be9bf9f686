"""µs of CPU (the thread's clock) for the pieces of a fenced write that branch
`sqlite-lean` made cheaper, each the best of nine rounds:

* the records one fenced write builds (the new effect, its send deadline, the
  admission's request and decision, the upstream's answer, the kept response, the
  receipt's plan, the effect after it and the receipt);
* the effect after a receipt's plan (`Plan.effect_after`);
* the kept answer's `response_headers` column (`store/rows.py` `response_meta`);
* the UTF-8 check of a fenced write's eight request headers.

Run it with each checkout's own virtualenv, from that checkout, to compare them:

    .venv/bin/python -m bench.fenced_records
    (cd ../base && .venv/bin/python /path/to/this/bench/fenced_records.py)
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable

from multidict import CIMultiDict

from core.fencing import AdmissionRequest, Admit
from core.lifecycle import Event, plan
from core.outcomes import Answered
from core.records import EffectRecord, EffectState, StoredResponse
from core.send_deadline import SendDeadline
from proxy.forwarding import UpstreamResponse
from proxy.requests import check_header_encoding
from store.rows import response_meta
from store.types import Admitted, NewEffect, Receipt

KEPT = StoredResponse(
    200,
    (
        ("Content-Type", "application/json; charset=utf-8"),
        ("Date", "Sun, 06 Dec 2026 02:40:00 GMT"),
        ("Server", "Python/3.11 aiohttp/3.14.5"),
    ),
    b'{"ok": true}',
    reason="OK",
    body_kept=True,
)
HEADERS = CIMultiDict(
    [
        ("Host", "127.0.0.1:41234"),
        ("Content-Type", "application/json"),
        ("Fence-Token", "ft_" + "a" * 40),
        ("Idempotency-Key", "0123456789abcdef0123456789abcdef"),
        ("Accept", "*/*"),
        ("Accept-Encoding", "gzip, deflate"),
        ("User-Agent", "Python/3.11 aiohttp/3.14.5"),
        ("Content-Length", "27"),
    ]
)


def _dispatching() -> EffectRecord:
    return EffectRecord(
        id="eff_0193a4c2d1e0f1e2d3c4b5a69788",
        route="sink",
        resource="bench:w1",
        holder="worker-1",
        epoch=3,
        idempotency_key="0123456789abcdef0123456789abcdef",
        fingerprint="f" * 64,
        method="POST",
        path="/sink/w1",
        state=EffectState.DISPATCHING,
        instance_id="instance-1",
        created_at=1000.0,
        deadline=1005.0,
        finished_at=None,
        upstream_status=None,
        reason=None,
    )


def records() -> None:
    new = NewEffect(
        route="sink",
        resource="bench:w1",
        idempotency_key="0123456789abcdef0123456789abcdef",
        fingerprint="f" * 64,
        method="POST",
        path="/sink/w1",
        max_in_flight=1,
        upstream_timeout_s=5.0,
        retain_s=3600.0,
        upstream_idempotent=False,
        send_window_s=0.0,
    )
    SendDeadline.start(new.send_window_s, time.monotonic)
    AdmissionRequest(new.resource, new.idempotency_key, new.fingerprint, 1, 5.0, False)
    effect = _dispatching()
    Admitted(effect, Admit().resends)
    Answered(200)
    UpstreamResponse(200, "OK", CIMultiDict(), b'{"ok": true}')
    kept = StoredResponse(200, KEPT.headers, KEPT.body, reason="OK", body_kept=True)
    written = plan(
        effect, Event.ANSWERED_COMMITTED, "answered 200", upstream_status=200, response=kept
    )
    assert written is not None
    Receipt(written.step, written.effect_after(effect, 1000.5))


RECEIPT = plan(_dispatching(), Event.ANSWERED_COMMITTED, "answered 200", upstream_status=200)
BEFORE = _dispatching()


def effect_after() -> None:
    assert RECEIPT is not None
    RECEIPT.effect_after(BEFORE, 1000.5)


def best_us(work: Callable[[], object], number: int) -> float:
    rounds = timeit.repeat(work, number=number, repeat=9, timer=time.thread_time)
    return min(rounds) / number * 1e6


def main() -> None:
    print(f"records of a fenced write   {best_us(records, 5000):6.2f} µs")
    print(f"Plan.effect_after            {best_us(effect_after, 20000):6.2f} µs")
    print(f"response_meta                {best_us(lambda: response_meta(KEPT), 20000):6.2f} µs")
    print(
        "check_header_encoding, 8    "
        f"{best_us(lambda: check_header_encoding(HEADERS), 20000):6.2f} µs"
    )


if __name__ == "__main__":
    main()
