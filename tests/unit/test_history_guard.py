"""store/history.py: the rule every transaction's history check applies (what counts as
lost history, given the last position this process saw and the one the server tells),
and when a loss found is already recovered."""

from __future__ import annotations

from store.history import (
    NOTICE,
    Position,
    Server,
    advance,
    judge,
    parse_notice,
    recovered_on,
)


def test_a_newer_timeline_than_the_one_seen_is_lost_history() -> None:
    lost = judge(None, Position(2, 100), Position(1, 500))
    assert lost is not None and "timeline 2" in lost and "last saw timeline 1" in lost


def test_an_older_timeline_than_the_one_seen_is_lost_history_too() -> None:
    # The old primary came back, never rewound, after a recovery on the promoted
    # standby: the store's own record on it says timeline 1, as the server does.
    assert judge(1, Position(1, 10_000), Position(2, 500)) is not None
    assert judge(None, Position(1, 10_000), Position(2, 500)) is not None


def test_the_same_timeline_at_or_past_the_position_seen_is_no_loss() -> None:
    assert judge(None, Position(1, 500), Position(1, 500)) is None
    assert judge(None, Position(1, 501), Position(1, 500)) is None
    assert judge(1, Position(1, 501), Position(1, 500)) is None


def test_one_byte_behind_the_position_seen_is_a_restore() -> None:
    lost = judge(None, Position(1, 499), Position(1, 500))
    assert lost is not None and "went back" in lost and "0/1F4" in lost and "0/1F3" in lost


def test_the_stores_record_of_another_timeline_is_a_loss_with_or_without_memory() -> None:
    assert judge(1, Position(2, 900), None) is not None
    assert judge(1, Position(2, 900), Position(2, 800)) is not None


def test_nothing_seen_nothing_recorded_is_taken_as_it_is() -> None:
    assert judge(None, Position(1, 0), None) is None


def test_the_position_kept_is_the_newest_on_its_timeline() -> None:
    assert advance(None, Position(1, 5)) == Position(1, 5)
    assert advance(Position(1, 9), Position(1, 5)) == Position(1, 9)
    assert advance(Position(1, 5), Position(1, 9)) == Position(1, 9)
    # Another timeline (judged, recovered) starts the count again.
    assert advance(Position(1, 9), Position(2, 3)) == Position(2, 3)


def test_only_a_recovery_on_this_very_server_counts() -> None:
    here = Server(2, 1000.5)
    assert recovered_on(Server(2, 1000.5), here)
    # A window opened before the restore (the server restarted since), on another
    # timeline, or never: recover.
    assert not recovered_on(Server(2, 999.0), here)
    assert not recovered_on(Server(1, 1000.5), here)
    assert not recovered_on(None, here)


def test_the_servers_notice_tells_both_positions() -> None:
    told = parse_notice(f"{NOTICE}00000002000000000000000A 0/A000060 0/A0000D8 901 0")
    assert told == (Position(2, 0xA0000D8, 901), Position(2, 0xA000060, 0))
    assert parse_notice("some other notice") is None
    # Before its COMMIT, a transaction that wrote tells its own id: kept one past it.
    own = parse_notice(f"{NOTICE}00000001000000000000000A 0/A000060 0/A0000D8 901 900")
    assert own is not None and own[1] == Position(1, 0xA000060, 901)


def test_a_transaction_id_committed_and_not_yet_issued_again_is_a_restore() -> None:
    # Restored WAL can land past the position seen (a restart writes WAL of its own);
    # a committed transaction's id is issued again only on a server that lost it.
    lost = judge(None, Position(1, 9_000, 900), Position(1, 5_000, 901))
    assert lost is not None and "transaction 900" in lost
    assert judge(None, Position(1, 9_000, 901), Position(1, 5_000, 901)) is None


def test_the_transaction_id_kept_is_the_newest() -> None:
    assert advance(Position(1, 5, 901), Position(1, 6, 0)) == Position(1, 6, 901)
    assert advance(Position(1, 5, 0), Position(1, 6, 950)) == Position(1, 6, 950)
