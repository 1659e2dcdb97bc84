import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """``../shared`` beside the repository (CI lays a copy there); override with CRUCIBLE_SHARED."""
    return Path(os.environ.get("CRUCIBLE_SHARED", ROOT.parent / "shared"))


@pytest.fixture(scope="session")
def curation_cases() -> dict:
    path = shared_dir() / "cases" / "curation.json"
    if not path.exists():
        pytest.fail(f"curation cases not found at {path} (set CRUCIBLE_SHARED)")
    return {c["id"]: c for c in json.loads(path.read_text())}


@pytest.fixture(scope="session")
def benchmark():
    from ops.curation.sources import benchmark_items

    return benchmark_items()


@pytest.fixture(scope="session")
def math_test_rows():
    from ops.curation.sources import math_test

    return math_test()
