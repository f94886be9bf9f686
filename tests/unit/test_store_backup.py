"""`store backup` refuses what it cannot do in words an operator can act on."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from store import StoreError
from store.files import backup_sqlite


def a_store(tmp_path: Path) -> str:
    path = tmp_path / "fence.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")
    return f"sqlite:///{path}"


def test_a_backup_into_a_missing_folder_names_the_folder(tmp_path: Path) -> None:
    target = tmp_path / "no-such-folder" / "backup.db"
    with pytest.raises(StoreError, match=r"no-such-folder: no such folder") as refused:
        backup_sqlite(a_store(tmp_path), target)
    assert "unable to open database file" not in str(refused.value)
    assert not target.parent.exists()


def test_a_backup_is_a_copy_that_opens(tmp_path: Path) -> None:
    target = tmp_path / "backup.db"
    backup_sqlite(a_store(tmp_path), target)
    with sqlite3.connect(target) as copy:
        assert copy.execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]
