"""Regenerates docs/status-page.png: `python -m devtools.status_page_screenshot`.

The picture is the browser test's own screenshot of a resolution awaiting confirmation
(tests/integration/processes/test_status_page.py, `status-page-resolve-confirmation.png`):
`fenceproxy serve` and the demo upstream as processes, an order whose answer the
upstream dropped after committing, its effect's history open, and an operator's
resolve about to be confirmed. So the picture shows what the page shows now, and the
test checks the same state. Needs Debian's chromium and chromium-driver.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = (
    "tests/integration/processes/test_status_page.py"
    "::test_a_lost_answer_shows_blocked_and_is_resolved_from_the_page"
)
SHOT = "status-page-resolve-confirmation.png"
TARGET = ROOT / "docs" / "status-page.png"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="status-page-") as scratch:
        base = Path(scratch) / "pytest"
        command = [sys.executable, "-m", "pytest", TEST, "-q", "--basetemp", str(base)]
        ran = subprocess.run(
            command,
            cwd=ROOT,
            check=False,
        )
        shots = sorted(base.rglob(SHOT))
        if ran.returncode != 0 or len(shots) != 1:
            sys.stderr.write(f"the browser test did not pass with one {SHOT}; nothing copied\n")
            return 1
        shutil.copyfile(shots[0], TARGET)
    sys.stdout.write(f"wrote {TARGET.relative_to(ROOT)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
