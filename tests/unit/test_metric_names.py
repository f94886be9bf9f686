"""The metrics page's table (docs/reference/metrics.md) names exactly the metrics the
proxy exports."""

from __future__ import annotations

import re
from pathlib import Path

from proxy import periodic
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


def test_the_failure_metric_names_every_background_loop() -> None:
    """Each loop run by proxy/periodic.py is a label of the failure counter from the
    start (a scrape sees 0, not nothing), and the table names exactly those."""
    row = re.search(
        r"^\| `fenceproxy_background_failures_total` \|.*\| `loop` \((.*)\) \|$",
        METRICS_PAGE.read_text(encoding="utf-8"),
        re.MULTILINE,
    )
    assert row is not None
    assert re.findall(r"`([a-z-]+)`", row.group(1)) == list(periodic.LOOPS)
    exported = {
        sample.labels["loop"]
        for family in Metrics().registry.collect()
        if family.name == "fenceproxy_background_failures"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert exported == set(periodic.LOOPS)
