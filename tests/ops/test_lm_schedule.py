"""ops.lm.schedule.LrSchedule: the rate along a run, its checks naming the field's path, and the
specs that hold it as a nested part (SFT, the RL warm start)."""

import dataclasses
import hashlib
import json
import math

import pytest

from ops.lm.schedule import LrSchedule
from ops.lm.spec import build
from ops.posttrain.sft import SftPlan, Stage2Plan
from ops.rl.warmstart import RECIPE_VERSION, WarmStartSpec


def test_the_rate_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    s = LrSchedule(lr=1e-3, warmup_steps=4, min_lr_ratio=0.1, weight_decay=0.0)
    steps = 104
    assert [s.lr_at(t, steps) for t in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    # halfway through the decay: the mean of the peak and the floor
    assert s.lr_at(4 + 50, steps) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert s.lr_at(4 + 25, steps) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))))
    assert s.lr_at(steps, steps) == pytest.approx(1e-4) and s.lr_at(steps + 50, steps) == pytest.approx(1e-4)
    # min_lr_ratio 1: warm-up then constant (the D-CPT probes' shape)
    flat = LrSchedule(lr=3e-3, warmup_steps=10, min_lr_ratio=1.0, weight_decay=0.01)
    assert [flat.multiplier(50)(t) for t in (0, 9, 10, 49, 80)] == pytest.approx([0.1, 1.0, 1.0, 1.0, 1.0])
    assert LrSchedule(lr=2.0, warmup_steps=0, min_lr_ratio=0.5, weight_decay=0.0).lr_at(0, 10) == pytest.approx(2.0)


def test_the_torch_scheduler_follows_lr_at():
    torch = pytest.importorskip("torch")
    s = LrSchedule(lr=4e-3, warmup_steps=3, min_lr_ratio=0.2, weight_decay=0.05)
    model = torch.nn.Linear(2, 1)
    opt = s.optimizer(model)
    assert opt.param_groups[0]["weight_decay"] == 0.05
    sched = s.scheduler(opt, 12)
    seen = []
    for _ in range(14):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([s.lr_at(t, 12) for t in range(14)])


@pytest.mark.parametrize("field,value,need", [
    ("lr", 0.0, "> 0"), ("warmup_steps", -1, "an integer >= 0"), ("min_lr_ratio", 1.5, "in \\[0, 1\\]"),
    ("weight_decay", -0.1, ">= 0")])
def test_a_bad_schedule_field_is_named_by_its_path(tmp_path, field, value, need):
    with pytest.raises(ValueError, match=f"^sft\\.schedule\\.{field} must be {need}, got"):
        SftPlan.from_dict({"data_dir": "d", "eval_path": "e", "schedule": {**dataclasses.asdict(SftPlan("d", "e").schedule),
                                                                           field: value}})
    with pytest.raises(ValueError, match=f"^warmstart\\.schedule\\.{field} must be {need}, got"):
        WarmStartSpec.from_json(json.dumps({"out_dir": str(tmp_path), "schedule": {
            **dataclasses.asdict(WarmStartSpec("o").schedule), field: value}}))


def test_a_partial_or_misspelt_schedule_names_the_field():
    with pytest.raises(TypeError, match="schedule.*missing.*min_lr_ratio"):
        build(WarmStartSpec, {"out_dir": "o", "schedule": {"lr": 1e-3, "warmup_steps": 3, "weight_decay": 0.0}})
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['schedule.warmup'\]"):
        build(SftPlan, {"data_dir": "d", "eval_path": "e", "schedule": {"warmup": 3}})


def test_each_stage_keeps_its_own_schedule_and_json_round_trips_it(tmp_path):
    assert SftPlan("d", "e").schedule == LrSchedule(lr=4e-3, warmup_steps=20, min_lr_ratio=0.1, weight_decay=0.01)
    assert Stage2Plan("d", "e").schedule == LrSchedule(lr=6e-4, warmup_steps=5, min_lr_ratio=0.1, weight_decay=0.01)
    assert WarmStartSpec("o").schedule == LrSchedule(lr=2e-3, warmup_steps=30, min_lr_ratio=0.1, weight_decay=0.0)
    spec = WarmStartSpec(str(tmp_path), schedule=LrSchedule(lr=5e-4, warmup_steps=7, min_lr_ratio=0.3, weight_decay=0.1))
    back = WarmStartSpec.from_json(spec.to_json())
    assert back == spec and isinstance(back.schedule, LrSchedule)
    assert json.loads(spec.to_json())["schedule"] == {"lr": 5e-4, "warmup_steps": 7, "min_lr_ratio": 0.3, "weight_decay": 0.1}


def test_the_warm_start_fingerprint_hashes_the_schedule_flat_as_before():
    """A recipe trained before the schedule was a part keeps its fingerprint (its published policy
    stays reusable): the hash is of the flat fields lr, weight_decay, warmup_steps, min_lr_ratio."""
    spec = WarmStartSpec("o")
    flat = {k: v for k, v in dataclasses.asdict(spec).items() if k not in ("schedule", *WarmStartSpec.CADENCE)}
    flat.update(lr=2e-3, weight_decay=0.0, warmup_steps=30, min_lr_ratio=0.1, recipe_version=RECIPE_VERSION)
    assert spec.fingerprint() == hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()[:16]
    other = dataclasses.replace(spec, schedule=dataclasses.replace(spec.schedule, min_lr_ratio=0.2))
    assert other.fingerprint() != spec.fingerprint()
