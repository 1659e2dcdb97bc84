"""The switching benchmark's statistics: per-seed paired differences and their Student-t CI."""
import pytest

from benchmarks.gba_bench import ci95, paired_differences


def test_paired_differences_are_per_seed_and_use_student_t():
    aucs = {"sync": [0.70, 0.69, 0.71], "sync_to_gba": [0.701, 0.689, 0.712], "sync_to_async": [0.698, 0.686, 0.709]}
    pd = paired_differences(aucs)
    # gba - async per seed: +0.003, +0.003, +0.003 -> zero spread, CI collapses on the mean
    assert pd["sync_to_gba_minus_sync_to_async"]["values"] == [0.003, 0.003, 0.003]
    assert pd["sync_to_gba_minus_sync_to_async"]["ci95"] == [0.003, 0.003]
    # gba - sync: +0.001, -0.001, +0.002 -> mean 0.000667, t(0.975, 2) = 4.3027, sd 0.0015275
    d = pd["sync_to_gba_minus_sync"]
    assert d["mean"] == pytest.approx(0.00067, abs=1e-5)
    assert d["ci95"] == pytest.approx([0.00067 - 0.003795, 0.00067 + 0.003795], abs=2e-5)
    # unpaired CIs of the same runs are far wider than the paired one (the seed's draw is shared)
    assert ci95(aucs["sync_to_gba"])["ci95"][1] - ci95(aucs["sync_to_gba"])["ci95"][0] > 0.05


def test_paired_differences_skip_missing_kinds():
    assert paired_differences({"sync": [0.7], "sync_to_gba": [0.7]}).keys() == {"sync_to_gba_minus_sync"}


def _switching_file(path, seeds, workers=16, gba=0.697, asyn=0.694):
    import json

    runs = [{"run": k, "seed": s, "final_auc": v + 0.001 * s} for s in seeds
            for k, v in (("sync", 0.697), ("sync_to_gba", gba), ("sync_to_async", asyn))]
    path.write_text(json.dumps({"switching": {"workers": workers, "local_batch": 128, "global_batch": 2048, "dense_lr": 3e-3,
                                              "sparse_lr": 3e-2, "epochs": 2.0, "trace": {"kind": "persistent"},
                                              "switch_at_fraction": 0.5, "num_ps": 2, "runs": runs}}))
    return path


def test_pool_switching_pools_disjoint_seeds_and_refuses_overlap_or_other_setups(tmp_path):
    import json

    from benchmarks.gba_bench import pool_switching

    a = _switching_file(tmp_path / "a.json", [0, 1])
    b = _switching_file(tmp_path / "b.json", [2, 3], gba=0.699)
    assert pool_switching([a, b], tmp_path / "out.json", []) == 0
    sw = json.loads((tmp_path / "out.json").read_text())["switching"]
    assert sw["seeds"] == 4 and sw["workers"] == 16
    assert sw["paired"]["sync_to_gba_minus_sync_to_async"]["values"] == [0.003, 0.003, 0.005, 0.005]
    assert sw["paired"]["sync_to_gba_minus_sync_to_async"]["mean"] == pytest.approx(0.004)
    with pytest.raises(ValueError, match="a seed appears in more than one file"):
        pool_switching([a, a], tmp_path / "bad.json", [])
    with pytest.raises(ValueError, match="c.json: switching setup"):
        pool_switching([a, _switching_file(tmp_path / "c.json", [5], workers=8)], tmp_path / "bad.json", [])
    lacking = _switching_file(tmp_path / "d.json", [7])
    lacking.write_text(lacking.read_text().replace('"run": "sync_to_async"', '"run": "sync_to_gba"', 1))
    with pytest.raises(ValueError, match=r"d.json: seed 7 has no \['sync_to_async'\] run"):
        pool_switching([a, lacking], tmp_path / "bad.json", [])
    assert not (tmp_path / "bad.json").exists()
