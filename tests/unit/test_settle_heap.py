"""`serve`, once listening, freezes the startup heap out of the cyclic collector's reach
and makes first-generation collections rarer (proxy/cli_serve.py `settle_heap`). Run in
a process of its own: the collector's settings are the whole process's."""

from __future__ import annotations

import json
import subprocess
import sys

from proxy.cli_serve import GC_FIRST_GENERATION_THRESHOLD

PROBE = """
import gc, json
from proxy.cli_serve import settle_heap
before = gc.get_threshold()
alive = len(gc.get_objects())
settle_heap()
print(json.dumps({"before": before, "after": gc.get_threshold(),
                  "frozen": gc.get_freeze_count(), "alive": alive,
                  "left": len(gc.get_objects())}))
"""


def test_the_startup_heap_is_frozen_and_the_first_generation_threshold_raised() -> None:
    found = json.loads(
        subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
        ).stdout
    )

    assert found["frozen"] >= found["alive"] > 10_000  # the modules' objects, at least
    assert found["left"] < found["alive"] // 10  # a full collection no longer scans them
    assert found["after"] == [GC_FIRST_GENERATION_THRESHOLD, *found["before"][1:]]
    assert found["before"][0] < GC_FIRST_GENERATION_THRESHOLD
