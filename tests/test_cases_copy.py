"""The repository's copy of the shared cases (tests/cases/) matches the project's shared cases where
those lie beside the checkout (a developer machine; CI's fresh clone may not have them)."""

import json

import pytest

from tests.conftest import ROOT, cases_dir


@pytest.mark.parametrize("name", ["curation.json", "training.json"])
def test_case_copy_matches_shared(name):
    shared = ROOT.parent / "shared" / "cases" / name
    if not shared.exists():
        pytest.skip(f"no shared cases beside the checkout ({shared})")
    assert json.loads((cases_dir() / name).read_text()) == json.loads(shared.read_text())


def test_case_ids_named_by_issues_are_present():
    ids = {c["id"] for n in ("curation.json", "training.json") for c in json.loads((cases_dir() / n).read_text())}
    assert {"weight-sync-commit-atomic", "reward-think-block", "cpu-path-without-torchrec",
            "ps-worker-dies", "sparse-checkpoint-reshard", "dedup-threshold-edges"} <= ids
