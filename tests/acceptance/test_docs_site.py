"""The docs site builds with `mkdocs build --strict` (a broken link, a missing page or a
missing included snippet fails), offline, into a temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    # The README's walkthrough is included into the tutorial, not copied.
    tutorial = (tmp_path / "tutorials" / "stale-write" / "index.html").read_text("utf-8")
    assert "worker-b" in tutorial
    # Nothing is fetched by a reader's browser from a font service either.
    index = (tmp_path / "index.html").read_text("utf-8")
    assert "fonts.googleapis.com" not in index
