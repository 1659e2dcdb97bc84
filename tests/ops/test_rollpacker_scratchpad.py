"""RollPacker on the scratchpad task (docs/rollpacker.md): a short real run of the driver's methods
with the warm-started policy, in process (``LocalActors``). The epoch is the scratchpad stream,
every trained prompt comes from it (each once per method, none dropped), the held-out evaluation
is recorded before the first and after the last step with the trainer's policy version, and the
result lists the length of every trained response. A wrong task is refused naming the field."""

import os
from pathlib import Path

import pytest

from ops.rl import scratchpad as sp
from ops.rl.rollpacker.driver import (RunSpec, RunState, fingerprint, heldout_problems, load_prompts, result_fields,
                                     run_methods)
from tests.conftest import RecordingPipes

POLICY = os.environ.get("CRUCIBLE_SCRATCHPAD_POLICY")


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A scratchpad policy folder: the warm-started one named by CRUCIBLE_SCRATCHPAD_POLICY, else
    a short real warm start (ops.rl.warmstart, 20 steps: the run's wiring, not its learning)."""
    if POLICY and (Path(POLICY) / "model.safetensors").exists():
        return POLICY
    from ops.rl.warmstart import WarmStartSpec, train

    out = tmp_path_factory.mktemp("policy")
    spec = WarmStartSpec(out_dir=str(out / "policy"), max_steps=20, batch_problems=8, eval_every=20, eval_size=8,
                         final_eval_size=8, n_embd=64, n_layer=2, checkpoint_every=20).validate()
    train(spec, out, RecordingPipes(0))
    return str(out / "policy")


def test_wrong_task_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"rollpacker\.task"):
        RunSpec(task="arithmetic", tokenizer_dir="x").validate()
    with pytest.raises(ValueError, match=r"rollpacker\.eval_size"):
        RunSpec(problems_path="p.parquet", tokenizer_dir="x", eval_size=4).validate()   # held-out needs scratchpad
    with pytest.raises(ValueError, match=r"rollpacker\.eval_every"):
        RunSpec(task="scratchpad", tokenizer_dir="x", eval_every=-1).validate()
    # the sampling distribution is checked at the asset boundary, not first inside an engine actor
    with pytest.raises(ValueError, match=r"rollpacker\.top_p must be in \(0, 1\]"):
        RunSpec(task="scratchpad", tokenizer_dir="x", top_p=1.5).validate()
    with pytest.raises(ValueError, match=r"rollpacker\.top_k"):
        RunSpec(task="scratchpad", tokenizer_dir="x", top_k=-1).validate()
    with pytest.raises(ValueError, match=r"rollpacker\.temperature must be > 0"):
        RunSpec(task="scratchpad", tokenizer_dir="x", temperature=0.0).validate()
    assert RunSpec(task="scratchpad", tokenizer_dir="x", top_k=5, top_p=0.9, temperature=0.7).validate().top_p == 0.9


def test_scratchpad_run_records_eval_lengths_and_trains_every_prompt_once(policy_dir, tmp_path):
    from ops.rl.policy import load_tokenizer
    from ops.rl.ray_actors import LocalActors

    steps, p0, r0, n_eval = 3, 2, 2, 12
    spec = RunSpec(task="scratchpad", task_seed=7, tokenizer_dir=policy_dir, model_dir=policy_dir,
                   methods=["baseline", "rollpacker"], steps=steps, prompts_per_step=p0, responses_per_prompt=r0,
                   eta=1.5, max_new_tokens=64, timeout_s=60, lr=1e-5, eval_size=n_eval).validate()
    tok = load_tokenizer(policy_dir)
    prompts = load_prompts(spec, tok)
    epoch = sp.problems(7, steps * p0)
    assert [p.uid for p in prompts] == [q.uid for q in epoch] and [p.text for p in prompts] == [q.prompt for q in epoch]
    assert prompts[0].answer == epoch[0].answer

    actors = LocalActors(spec.policy(), spec.policy(), reward_item_timeout_s=20)
    state = RunState(tmp_path, fingerprint(spec))
    try:
        rows = run_methods(spec, prompts, RecordingPipes(0), actors, state)
    finally:
        actors.kill()
    res = result_fields(spec, rows, state.evals)
    assert res["task"] == "scratchpad"
    held = heldout_problems(spec)
    assert [q.prompt for q in held] == [q.prompt for q in sp.problems(7 + 1000, n_eval, split="heldout")]
    assert not {q.prompt for q in held} & {p.text for p in prompts}     # disjoint from the epoch by prompt text
    assert {sp.split_of(q.a, q.n) for q in held} == {"heldout"} and {sp.split_of(q.a, q.n) for q in epoch} == {"train"}
    for m in spec.methods:
        mr = [r for r in rows if r["method"] == m]
        assert len(mr) == steps
        trained = [u for r in mr for u in r["trained_prompts"]]
        assert sorted(trained) == sorted(p.uid for p in prompts)         # each epoch prompt exactly once
        ev = res["eval"][m]
        assert [e["step"] for e in ev] == [0, steps]                     # eval_every 0: before and after
        assert [e["policy_version"] for e in ev] == [0, steps]
        assert all(0.0 <= e["accuracy"] <= 1.0 and e["n"] == n_eval for e in ev)
        assert ev[0]["train_wall_s"] == 0.0
        assert ev[-1]["train_wall_s"] == pytest.approx(sum(r["step_s"] for r in mr))   # eval time excluded
        assert ev[-1]["train_wall_s"] >= sum(r["rollout_s"] for r in mr) > 0
        lens = res["response_lengths"][m]
        assert len(lens) == sum(r["trained_responses"] for r in mr) == steps * p0 * r0
        assert all(1 <= n <= spec.max_new_tokens for n in lens)
        assert max(lens) == max(r["max_response_len"] for r in mr)
        # one versioned sync per step, none refused (a single publisher never races itself)
        assert res["weight_syncs"][m] == {"policy_version": steps, "stale_syncs_refused": 0, "failed_syncs": 0}
        assert [r["sync"]["policy_version"] for r in mr] == list(range(1, steps + 1))
    # same initial policy, same eval seed: the step-0 evaluations of both methods are identical
    assert res["eval"]["baseline"][0]["accuracy"] == res["eval"]["rollpacker"][0]["accuracy"]
    assert {r["round"] for r in rows if r["method"] == "rollpacker"} <= {"short", "long"}


def test_accuracy_summary_reads_the_eval_entries():
    from ops.rl.rollpacker.report import accuracy_summary

    ev = {"baseline": [{"step": 0, "train_wall_s": 0.0, "accuracy": 0.4, "n": 8, "policy_version": 0},
                       {"step": 4, "train_wall_s": 12.5, "accuracy": 0.625, "n": 8, "policy_version": 4}], "rollpacker": []}
    assert accuracy_summary(ev) == [{"method": "baseline", "accuracy_before": 0.4, "accuracy_after": 0.625,
                                     "gain_points": 22.5, "n": 8, "steps": 4, "train_wall_s": 12.5, "evaluations": 2}]
