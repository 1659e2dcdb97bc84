"""The browser test is opt-in: it runs with ``pytest -m ui tests/ui`` (or CRUCIBLE_UI_TESTS=1), never in
the default ``make test`` (it starts ``dagster dev`` and a headless Chromium: ~1-2 minutes)."""

import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "ui: drives the Dagster UI in headless Chromium (opt-in: -m ui)")


def pytest_collection_modifyitems(config, items):
    if "ui" in (config.getoption("-m") or "") or os.environ.get("CRUCIBLE_UI_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="browser test: run with `pytest -m ui tests/ui` (or CRUCIBLE_UI_TESTS=1)")
    for item in items:
        if item.get_closest_marker("ui"):
            item.add_marker(skip)
