"""store/history.py: when the authority may have lost what the store acknowledged."""

from __future__ import annotations

from store.history import Position, Replication, format_lsn, judge, parse_position


def test_the_timeline_and_lsn_are_read_from_the_wal_file_name_and_position() -> None:
    position = parse_position("00000002000000000000007A", "0/7A0001F8")
    assert position == Position(2, 0x7A0001F8)
    assert parse_position("0000000A0000000100000003", "1/3000028") == Position(
        10, (1 << 32) + 0x3000028
    )
    assert format_lsn((1 << 32) + 0x3000028) == "1/3000028"


def test_the_same_timeline_moving_forward_lost_nothing() -> None:
    assert judge(1, Position(1, 500), Position(1, 400)) is None
    assert judge(1, Position(1, 500), None) is None


def test_a_store_never_checked_before_is_taken_as_it_is() -> None:
    assert judge(None, Position(3, 10), None) is None


def test_another_timeline_than_the_one_written_on_is_lost_history() -> None:
    lost = judge(1, Position(2, 900), None)
    assert lost is not None and "timeline 2" in lost and "timeline 1" in lost
    # Lower too: a dump restored into a new cluster starts over at 1.
    assert judge(4, Position(1, 900), None) is not None


def test_a_process_that_saw_another_timeline_finds_the_loss_in_a_store_never_checked() -> None:
    assert judge(None, Position(2, 900), Position(1, 800)) is not None


def test_a_timeline_recorded_by_a_replica_that_recovered_first_is_still_a_loss_to_judge() -> None:
    # Another replica recovered and recorded timeline 2; this one last saw timeline 1:
    # a loss, which it finds recovered on this server (store/history.py recovered_on).
    assert judge(2, Position(2, 900), Position(1, 950)) is not None


def test_the_wal_going_back_on_one_timeline_is_lost_history() -> None:
    lost = judge(1, Position(1, 400), Position(1, 500))
    assert lost is not None and "went back" in lost


def test_no_standby_no_warning() -> None:
    assert Replication(0, "", "on").warning() is None


def test_an_asynchronous_standby_is_warned_of() -> None:
    warning = Replication(1, "", "on", (None,)).warning()
    assert warning is not None and "synchronous_standby_names is empty" in warning
    local = Replication(1, "standby1", "local").warning()
    assert local is not None and "synchronous_commit is local" in local


def test_a_synchronous_standby_is_safe() -> None:
    for commit in ("on", "remote_apply", "remote_write"):
        assert Replication(1, "standby1", commit, ("sync",)).warning() is None
    # Without pg_read_all_stats the states are not visible: the settings decide.
    assert Replication(2, "ANY 1 (a, b)", "on", (None, None)).warning() is None


def test_a_potential_or_async_standby_beside_a_synchronous_one_is_warned_of() -> None:
    warning = Replication(2, "a", "on", ("sync", "async")).warning()
    assert warning is not None and "1 of 2" in warning
