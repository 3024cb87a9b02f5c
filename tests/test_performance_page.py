"""docs/performance.md holds what bench/make_report.py writes from bench/results/ (after a
benchmark run: ``python bench/make_report.py``), and quotes every result there and no other."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _make_report():
    spec = importlib.util.spec_from_file_location("make_report", ROOT / "bench" / "make_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_what_the_results_give():
    report = _make_report()
    page = report.PAGE.read_text()
    assert report.render(page) == page, (
        "docs/performance.md is out of date: python bench/make_report.py"
    )


def test_the_page_quotes_exactly_the_results_kept():
    page = (ROOT / "docs" / "performance.md").read_text()
    quoted = set(re.findall(r"bench/results/([\w.-]+\.json)", page))
    kept = {p.name for p in (ROOT / "bench" / "results").glob("*.json")}
    assert quoted == kept
