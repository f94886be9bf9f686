"""The metrics page's table (docs/reference/metrics.md) names exactly the metrics the
proxy exports."""

from __future__ import annotations

import re
from pathlib import Path

from proxy.metrics import Metrics

METRICS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "metrics.md"


def test_the_metrics_table_lists_every_exported_metric_and_no_other() -> None:
    section = METRICS_PAGE.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(fenceproxy_\w+)` \|", section, re.MULTILINE))
    exported = {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in Metrics().registry.collect()
    }
    assert documented == exported
