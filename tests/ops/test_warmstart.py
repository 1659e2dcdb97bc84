"""The scratchpad warm start (ops/rl/warmstart.py, docs/rl_policy.md): the training rows and their
loss masks, a short real run that learns and publishes a loadable policy folder, determinism and
resume after a crash, reuse of a published folder, and spec errors that name the field."""

import json
from pathlib import Path

import pytest

from ops.launch import _LocalPipes
from ops.rl import scratchpad as sp
from ops.lm.schedule import LrSchedule
from ops.rl import warmstart as ws

TINY = {"n_embd": 32, "n_layer": 1, "n_head": 2, "batch_problems": 4, "max_lines": 12, "eval_every": 2,
        "eval_size": 4, "final_eval_size": 4, "max_new_tokens": 16, "target_pass_rate": 1.0,
        "schedule": LrSchedule(lr=2e-3, warmup_steps=1, min_lr_ratio=0.1, weight_decay=0.0)}


def _spec(out: Path, **kw) -> ws.WarmStartSpec:
    return ws.WarmStartSpec(out_dir=str(out), **{**TINY, **kw}).validate()


def test_rows_carry_loss_on_the_responses_only_and_repeat_for_a_step(tmp_path):
    tok = sp.build_tokenizer()
    spec = _spec(tmp_path, batch_problems=64, max_lines=60, multi_turn_fraction=0.5, n_positions=320)
    b = ws.ProblemBatches(tok, spec)
    ids, mask = b.take(3)
    ids2, mask2 = b.take(3)
    assert (ids == ids2).all() and (mask == mask2).all()
    assert not (b.take(4)[0].shape == ids.shape and (b.take(4)[0] == ids).all())
    assert ids.shape[0] == 64 and ids.shape == mask.shape and ids.shape[1] <= ws.longest_row(60)
    kinds = set()
    for x, m in zip(ids.tolist(), mask.tolist()):
        text = tok.decode([t for t in x], skip_special_tokens=False)
        a, rest = text.split(":", 1)
        n = int(rest.split("=")[0].split("?")[0])
        assert sp.split_of(int(a), n) == "train"                           # never a held-out prompt
        loss = "".join(tok.decode([t]) if t else "|" for t, k in zip(x, m) if k)   # EOS shown as |
        if "=" in text.split("\n")[0]:
            kinds.add("single")
            assert loss == sp.solution(int(a), n) + "|"
        else:
            kinds.add("multi")
            turns = sp.tool_turns(int(a), n)
            assert loss == "".join(t for t, _ in turns) + "|"            # observations ("ok") carry no loss
            assert text.count(sp.CHECK_OK) == len(turns) - 1
        assert sum(m) == len(loss)
    assert kinds == {"single", "multi"}


def test_a_short_warm_start_learns_and_publishes_a_loadable_policy(tmp_path):
    from ops.rl.policy import load_policy, load_tokenizer

    out = tmp_path / "policy"
    spec = _spec(out, n_embd=64, n_layer=2, n_head=2, batch_problems=8, max_steps=30, eval_every=10, eval_size=4,
                 final_eval_size=8, max_new_tokens=40,
                 schedule=LrSchedule(lr=3e-3, warmup_steps=5, min_lr_ratio=0.1, weight_decay=0.0))
    info = ws.train(spec, tmp_path / "run", _LocalPipes(0))
    assert {"config.json", "model.safetensors", "tokenizer.json", "metrics.json"} <= {p.name for p in out.iterdir()}
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["fingerprint"] == spec.fingerprint() == info["fingerprint"]
    assert (saved["steps"], saved["stop_reason"]) == (30, "max_steps")       # target 1.0 is never reached here
    assert [e["step"] for e in saved["eval_curve"]] == [10, 20, 30]
    assert [p["step"] for p in saved["loss_curve"]] == [10, 20, 30]
    first, last = saved["loss_curve"][0]["loss"], saved["loss_curve"][-1]["loss"]
    assert last < 0.75 * first, (first, last)                                # the chain is learnable quickly
    assert saved["train_s"] > 0 and saved["eval_s"] > 0 and saved["wall_s"] >= saved["train_s"]
    assert set(saved["heldout"]) >= {"greedy", "sampled", "seed", "n"} and saved["heldout"]["n"] == 8
    assert sum(n for _, n in saved["heldout"]["greedy"]["by_lines"].values()) == 8
    lengths = [sp.response_length(p) for p in sp.problems(99, 8, split="heldout")]
    assert saved["rl_response_lengths"] == ws.length_stats(lengths)
    model, tok = load_policy(out), load_tokenizer(out)
    assert len(tok) == len(sp.CHARS) + 1 and tok.eos_token_id == 0 == tok.pad_token_id
    assert saved["params"] == sum(p.numel() for p in model.parameters())
    assert (model.config.n_embd, model.config.n_layer, model.config.n_positions) == (64, 2, 320)
    # the held-out figure is a property of the published weights: recomputing it gives the same number
    again = sp.heldout_accuracy(model, tok, sp.problems(99, 8, split="heldout"), 0.0, 40)
    assert again["accuracy"] == saved["heldout"]["greedy"]["accuracy"]
    gen = sp.heldout_accuracy(model, tok, sp.problems(99, 8, split="generalisation"), 0.0, 40)
    assert saved["heldout_generalisation"]["split"] == "generalisation"
    assert gen["accuracy"] == saved["heldout_generalisation"]["greedy"]["accuracy"]
    # a second launch of the same spec reuses the folder
    t = (out / "model.safetensors").stat().st_mtime_ns
    assert ws.train(spec, tmp_path / "run2", _LocalPipes(0))["fingerprint"] == spec.fingerprint()
    assert (out / "model.safetensors").stat().st_mtime_ns == t


def test_same_seed_same_policy_and_a_crashed_launch_resumes_to_it(tmp_path, monkeypatch):
    spec_a = _spec(tmp_path / "a", max_steps=4, checkpoint_every=2)
    spec_b = _spec(tmp_path / "b", max_steps=4, checkpoint_every=2)
    assert spec_a.fingerprint() == spec_b.fingerprint()                     # the output folder is not part of it
    a = ws.train(spec_a, tmp_path / "run-a", _LocalPipes(0))
    monkeypatch.setenv(ws.CRASH_ENV, "2")
    (tmp_path / "spec-b.json").write_text(spec_b.to_json())
    argv = ["--spec", str(tmp_path / "spec-b.json"), "--out", str(tmp_path / "run-b"), "--fingerprint", "fp"]
    from ops.lm.train import SimulatedCrash

    with pytest.raises(SimulatedCrash):
        ws.main(argv)
    assert json.loads((tmp_path / "run-b/runs/warmstart/state/state.json").read_text())["step"] == 2
    assert not (tmp_path / "b" / "metrics.json").exists()
    ws.main(argv)                                                           # the retry: resumes at step 2
    res = json.loads((tmp_path / "run-b" / "result.json").read_text())
    assert res["fingerprint"] == "fp" and res["resumes"] == [{"step": 2}]
    assert res["loss_curve"] == a["loss_curve"] and res["eval_curve"][-1]["accuracy"] == a["eval_curve"][-1]["accuracy"]
    assert (tmp_path / "a/model.safetensors").read_bytes() == (tmp_path / "b/model.safetensors").read_bytes()
    assert not (tmp_path / "run-b/runs/warmstart").exists()                # the checkpoint is gone once published
    # another seed is another policy
    c = ws.train(_spec(tmp_path / "c", max_steps=4, seed=1), tmp_path / "run-c", _LocalPipes(0))
    assert c["fingerprint"] != a["fingerprint"] and c["loss_curve"] != a["loss_curve"]


@pytest.mark.parametrize("field,value,match", [
    ("schedule", LrSchedule(lr=0.0, warmup_steps=30, min_lr_ratio=0.1, weight_decay=0.0), "warmstart.schedule.lr must be > 0"),
    ("target_pass_rate", 0.0, "warmstart.target_pass_rate must be in \\(0, 1\\]"),
    ("multi_turn_fraction", 1.5, "warmstart.multi_turn_fraction must be in \\[0, 1\\]"),
    ("n_positions", 100, "warmstart.n_positions must be >= 266"),
    ("n_head", 3, "warmstart.n_embd must be a multiple of n_head"),
    ("eval_every", 0, "warmstart.eval_every must be >= 1"),
])
def test_a_bad_spec_names_the_field(tmp_path, field, value, match):
    with pytest.raises(ValueError, match=match):
        ws.WarmStartSpec(out_dir=str(tmp_path), **{field: value}).validate()


def test_the_worker_rejects_an_unknown_field_naming_the_file(tmp_path):
    p = tmp_path / "spec.json"
    p.write_text(json.dumps({"out_dir": str(tmp_path), "lrr": 1.0}))
    with pytest.raises(ValueError, match="spec.json.*unknown field.*lrr"):
        ws.main(["--spec", str(p), "--out", str(tmp_path / "run")])
