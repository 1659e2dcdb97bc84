"""RollPacker runs resume after their last completed GRPO step: the trainer's state (weights,
optimizer, version) round-trips exactly, and a run interrupted right after a saved step continues
on a relaunch over the same folder — finished methods skipped, the planner position, policy
version and engine sampling stream restored — to the rows of an uninterrupted run. In process,
with the roles of the Ray actors called directly (``LocalActors``) and the tiny random policy."""

from pathlib import Path

import polars as pl
import pytest
import torch

from ops.rl.ray_actors import LocalActors, _TrainerImpl
from ops.rl.rollpacker.driver import RunSpec, RunState, fingerprint, load_prompts, run_methods
from ops.rl.rollpacker.stream import TrainSample
from tests.conftest import RecordingPipes

MODEL_DIR = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct"
TIMING = {"rollout_s", "step_s", "rollout_wall_s", "reward_wait_s", "train_tail_s", "sync_s", "train_compute_s"}


@pytest.fixture(scope="module")
def tok():
    if not (MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("SmolLM2 directory missing: run make setup")
    from ops.rl.policy import load_tokenizer

    return load_tokenizer(MODEL_DIR)


class Crash(Exception):
    pass


Pipes = RecordingPipes


def _samples(tok):
    ids = tok("What is 1 + 1?")["input_ids"]
    return [TrainSample(ids, [tok.eos_token_id or 0] * 3, 1.0, True), TrainSample(ids, [5, 6, 7], -1.0, True)]


def test_trainer_state_round_trips_weights_optimizer_and_version_exactly(tok, tmp_path):
    spec = {"tokenizer_dir": str(MODEL_DIR), "model_dir": None, "seed": 0, "lr": 1e-2}
    a = _TrainerImpl(spec)
    a.add(_samples(tok))
    assert a.step()["version"] == 1
    a.add(_samples(tok))
    with pytest.raises(RuntimeError, match="unfinished step"):
        a.save_checkpoint(str(tmp_path / "t.pt"))
    a.reset()
    assert a.save_checkpoint(str(tmp_path / "t.pt")) == 1
    b = _TrainerImpl(spec)                                           # a fresh actor: initial weights, version 0
    assert not torch.equal(b.trainer.model.lm_head.weight, a.trainer.model.lm_head.weight)
    assert b.load_checkpoint(str(tmp_path / "t.pt")) == 1 and b.trainer.version == 1
    for t in (a, b):                                                 # one more identical step on each
        t.add(_samples(tok))
        assert t.step()["version"] == 2
    sa, sb = a.trainer.model.state_dict(), b.trainer.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)                # equal only if the Adam moments were restored
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        b.load_checkpoint(str(tmp_path / "missing.pt"))


def test_engine_sampling_stream_round_trips(tok, tmp_path):
    from ops.rl.policy import chat_prompt
    from ops.rl.ray_actors import _EngineImpl

    spec = {"tokenizer_dir": str(MODEL_DIR), "model_dir": None, "seed": 0}
    prompt = [chat_prompt(tok, "q", "What is 2 + 2?", answer="4")]
    tokens = lambda e: [c.token_ids for c in e.engine.generate(prompt, 3, 6).completions]  # noqa: E731
    a = _EngineImpl(spec)
    tokens(a)                                                        # move the stream past its seed
    a.save_rng(str(tmp_path / "e.pt"))
    want = tokens(a)
    b = _EngineImpl(spec)                                            # a fresh engine starts at its seed
    assert tokens(b) != want
    b.reset()
    b.load_rng(str(tmp_path / "e.pt"))
    assert tokens(b) == want


def test_a_run_interrupted_after_a_step_resumes_to_the_uninterrupted_rows(tok, tmp_path):
    problems = tmp_path / "problems.parquet"
    pl.DataFrame({"problem_id": [f"p{i:02d}" for i in range(8)], "problem": [f"What is {i} + {i}?" for i in range(8)],
                  "answer": [str(2 * i) for i in range(8)]}).write_parquet(problems)
    spec = RunSpec(problems_path=str(problems), tokenizer_dir=str(MODEL_DIR), methods=["baseline", "rollpacker"], steps=2,
                   prompts_per_step=2, responses_per_prompt=2, eta=1.5, max_new_tokens=8, timeout_s=60).validate()
    prompts = load_prompts(spec, tok)
    fp = fingerprint(spec)

    def actors():
        pol = {"tokenizer_dir": spec.tokenizer_dir, "model_dir": None, "seed": spec.seed, "threads": 1}
        return LocalActors(pol, {**pol, "lr": spec.lr}, reward_item_timeout_s=20)

    def run(out, retry, on_saved=None):
        a, pipes = actors(), Pipes(retry)
        state = RunState(out, fp)
        state.load()
        try:
            return run_methods(spec, prompts, pipes, a, state, on_saved=on_saved), pipes, state
        finally:
            a.kill()

    whole, _, _ = run(tmp_path / "whole", 0)

    def crash_after_3(n):                  # baseline's 2 steps and rollpacker's step 0 saved, then the "kill"
        if n == 3:
            raise Crash()

    with pytest.raises(Crash):
        run(tmp_path / "cut", 0, crash_after_3)
    saved = RunState(tmp_path / "cut", fp)
    assert saved.load() and saved.done == ["baseline"] and saved.current["method"] == "rollpacker"
    assert sorted(p.name for p in saved.dir.glob("*.pt")) == ["engine-rollpacker-0.pt", "trainer-rollpacker-0.pt"]

    rows, pipes, state = run(tmp_path / "cut", 1)
    log = "\n".join(pipes.lines)
    assert "baseline: finished before this launch (2 steps), skipped" in log
    assert ("rollpacker: resuming after step 0 (policy version 1 published to the engine; 3 of 4 steps of the run done) "
            "on Dagster retry 1") in log
    assert "rollpacker run: GRPO steps (resumed with 3 of 4 done): 1/1 steps (100%)" in log
    assert [m["step"] for m in pipes.messages] == [1]                # only the missing step ran
    assert state.resumes == [{"method": "rollpacker", "after_step": 0, "policy_version": 1, "steps_done": 3,
                              "retry_number": 1}]
    assert [(r["method"], r["step"], r["round"], r["policy_version"]) for r in rows] == [
        ("baseline", 0, "sync", 0), ("baseline", 1, "sync", 1), ("rollpacker", 0, "short", 0), ("rollpacker", 1, "long", 1)]
    strip = lambda r: {k: v for k, v in r.items() if k not in TIMING}   # noqa: E731
    assert [strip(r) for r in rows] == [strip(r) for r in whole]      # same prompts, queue, versions, tokens, rewards
    assert state.done == ["baseline", "rollpacker"] and state.current is None and not list(state.dir.glob("*.pt"))
