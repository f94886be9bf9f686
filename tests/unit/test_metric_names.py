"""README's metrics table names exactly the metrics the proxy exports."""

from __future__ import annotations

import re
from pathlib import Path

from proxy.metrics import Metrics

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_metrics_table_lists_every_exported_metric_and_no_other() -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## Metrics\n") :]
    section = section[: section.index("\n## ", 1)]
    documented = set(re.findall(r"^\| `(fenceproxy_\w+)` \|", section, re.MULTILINE))
    exported = {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in Metrics().registry.collect()
    }
    assert documented == exported
