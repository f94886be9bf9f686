"""The sync client is written from the async one (devtools/unasync_client.py): the
generated files are current, the markers and the token table do what
docs/contributing says, and the two clients keep one API."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import pytest
from fenceproxy_client import (
    AsyncFenceClient,
    AsyncLease,
    AsyncLeaseScope,
    FenceClient,
    Lease,
    LeaseScope,
)

from devtools import unasync_client
from devtools.unasync_client import Pair, UnasyncError, join_nested_withs, unasync_text

# What the async client has and the sync one cannot: a thread cannot be cancelled
# (the sync client's `lease` docstring and docs/how-to/write-a-worker.md say so).
ASYNC_ONLY = {"cancel_on_lost"}
SYNC_NAMES = {"__aenter__": "__enter__", "__aexit__": "__exit__"}
DUNDERS = {"__enter__", "__exit__", "__init__", "__repr__"}


def test_the_generated_files_are_what_the_generator_writes() -> None:
    assert unasync_client.main(["--check"]) == 0


def copy_pairs(root: Path) -> None:
    for pair in unasync_client.PAIRS:
        for name in (pair.source, pair.target):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(unasync_client.ROOT / name, root / name)


def test_check_fails_on_a_hand_edit_and_a_run_writes_it_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy_pairs(tmp_path)
    target = tmp_path / unasync_client.PAIRS[0].target
    generated = target.read_text()
    target.write_text(generated.replace("self._stop.wait(wait_s)", "self._stop.wait(0)"))
    assert unasync_client.main(["--check"], root=tmp_path) == 1
    error = capsys.readouterr().err
    assert "+                if self._stop.wait(wait_s):" in error
    assert "make unasync" in error
    assert target.read_text() != generated  # --check writes nothing
    assert unasync_client.main([], root=tmp_path) == 0
    assert target.read_text() == generated
    assert unasync_client.main(["--check"], root=tmp_path) == 0


def test_the_generated_file_says_it_is_generated_from_what_and_how() -> None:
    for pair in unasync_client.PAIRS:
        head = (unasync_client.ROOT / pair.target).read_text().splitlines()[:3]
        assert head[0].startswith(f"# GENERATED from {pair.source} by devtools/unasync_client")
        assert "make unasync" in head[1]


def test_markers_keep_async_lines_out_and_put_sync_lines_in() -> None:
    source = """async def f(client: AsyncFenceClient) -> None:
    # unasync: async
    await asyncio.sleep(1)
    # unasync: sync
    # pause(1)
    #
    # unasync: end
    async with client.lease("r", "h") as lease:
        await lease.__aexit__(None, None, None)
    # unasync: sync
    # only_sync()
    # unasync: end
    # unasync: async
    only_async()
    # unasync: end
    await asyncio.sleep(2)
"""
    assert unasync_text(source, "x.py") == (
        """def f(client: FenceClient) -> None:
    pause(1)

    with client.lease("r", "h") as lease:
        lease.__exit__(None, None, None)
    only_sync()
    time.sleep(2)
"""
    )


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("# unasync: async\nx = 1\n", "never ended"),
        ("# unasync: sync\nx = 1\n# unasync: end\n", "must be commented out"),
        ("# unasync: end\n", "where ('async', 'sync') was expected"),
        ("# unasync: async\n# unasync: async\n", "where ('sync', 'end') was expected"),
        ("# unasync: sync\n# x = 1\n# unasync: async\n", "where ('end',) was expected"),
        ("# unasync: asnyc\n", "`# unasync: asnyc`"),
    ],
)
def test_a_misplaced_marker_stops_the_generator(source: str, why: str) -> None:
    with pytest.raises(UnasyncError, match=why.replace("(", r"\(").replace(")", r"\)")):
        unasync_text(source, "x.py")


def test_async_code_the_table_does_not_know_stops_the_generator(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "import asyncio\n\n\nasync def f() -> None:\n    await asyncio.gather()\n"
    )
    with pytest.raises(UnasyncError, match=r"s\.py:4: 'asyncio' left in the sync code"):
        unasync_client.generate(Pair("a.py", "s.py"), tmp_path)


def test_nested_withs_are_joined_as_lint_wants() -> None:
    code = """def f() -> None:
    with a() as x:
        with b():
            x()
            y()
    with c():
        with d():
            pass
        e()
"""
    assert join_nested_withs(code) == (
        """def f() -> None:
    with (a() as x, b()):
        x()
        y()
    with c():
        with d():
            pass
        e()
"""
    )


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        SYNC_NAMES.get(name, name): inspect.signature(member)
        for name, member in vars(cls).items()
        if callable(member) and (not name.startswith("_") or SYNC_NAMES.get(name, name) in DUNDERS)
    }


def shape(signature: inspect.Signature) -> list[tuple[str, object, object]]:
    return [
        (name, parameter.kind, parameter.default)
        for name, parameter in signature.parameters.items()
        if name not in ASYNC_ONLY
    ]


@pytest.mark.parametrize(
    ("async_class", "sync_class"),
    [(AsyncFenceClient, FenceClient), (AsyncLease, Lease), (AsyncLeaseScope, LeaseScope)],
)
def test_the_two_clients_have_the_same_methods_and_arguments(
    async_class: type, sync_class: type
) -> None:
    async_methods, sync_methods = public_methods(async_class), public_methods(sync_class)
    assert sorted(async_methods) == sorted(sync_methods)
    for name, signature in async_methods.items():
        assert shape(signature) == shape(sync_methods[name]), name
    properties = [n for n, m in vars(async_class).items() if isinstance(m, property)]
    assert properties == [n for n, m in vars(sync_class).items() if isinstance(m, property)]
