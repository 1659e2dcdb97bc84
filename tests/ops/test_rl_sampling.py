"""The trainer scores sampled tokens with exactly the engine's sampling distribution (case
logprob-temperature-consistent): temperature, top-k and top-p renormalisation, from one
SamplingConfig that the engine and the trainer actors read from the same spec."""

from pathlib import Path

import pytest
import torch

from ops.rl.engine import HFEngine
from ops.rl.grpo import token_logprobs
from ops.rl.policy import chat_prompt, tiny_policy
from ops.rl.ray_actors import _EngineImpl, _TrainerImpl
from ops.rl.rollpacker.stream import TrainSample
from ops.lm.sampling import SamplingConfig, sampling_logprobs

MODEL_DIR = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct"
NEG = float("-inf")


def _actors(**sampling):
    if not (MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("SmolLM2 directory missing: run make setup")
    spec = {"tokenizer_dir": str(MODEL_DIR), "seed": 0, "tiny_hidden": 64, "lr": 1e-3, **sampling}
    eng, tr = _EngineImpl(spec), _TrainerImpl(spec)
    # logits 6x sharper than the random init (flat over 49k tokens) give an LM-like distribution: a
    # nucleus of ~200 tokens at T 0.6 / top_p 0.8; scoring these samples at T = 1.0 (the trainer
    # before this fix) gives ratios 0.035-10.9 and clips 90% of the tokens. (On the flat init, ~19k
    # near-equal tokens sit at the nucleus boundary and float32 noise between the KV-cached decode
    # and the full forward can move one across it: a 2e-5 log-prob difference on 1 token of 192.)
    with torch.no_grad():
        for m in (eng.engine.model, tr.trainer.model):
            m.model.norm.weight.mul_(6.0)
    return eng.engine, tr.trainer


@pytest.mark.parametrize("top_p, top_k", [(1.0, 0), (0.8, 0), (1.0, 40), (0.8, 40)])
def test_case_logprob_temperature_consistent(top_p, top_k):
    engine, trainer = _actors(temperature=0.6, top_p=top_p, top_k=top_k)
    assert trainer.sampling == engine.sampling == SamplingConfig(0.6, top_k, top_p)
    sd = trainer.model.state_dict()
    assert all(torch.equal(v, sd[k]) for k, v in engine.model.state_dict().items())
    tok = engine.tokenizer
    ps = {f"q{i}": chat_prompt(tok, f"q{i}", f"What is {i} + {i}?", answer=str(2 * i)) for i in range(2)}
    out = engine.generate(list(ps.values()), n=4, max_new_tokens=24, timeout_s=120)
    samples = [TrainSample(ps[c.prompt_uid].token_ids, c.token_ids, 1.0 if c.index % 2 else -1.0, True, c.logprobs)
               for c in out.completions]
    # the trainer's log-prob of every sampled token == the engine's (not only on average)
    got = trainer.logprobs(samples)
    for s, lp in zip(samples, got):
        assert len(lp) == len(s.old_logprobs) > 0
        assert torch.allclose(torch.tensor(lp), torch.tensor(s.old_logprobs), rtol=0, atol=1e-5)
        ratio = torch.exp(torch.tensor(lp) - torch.tensor(s.old_logprobs))
        assert torch.allclose(ratio, torch.ones_like(ratio), rtol=0, atol=1e-4)
    # the loss over the same samples clips nothing on the unchanged policy
    trainer.add(samples)
    assert trainer.stats["tokens"] == sum(len(s.response_ids) for s in samples)
    assert trainer.stats["clip_fraction"] == 0.0
    trainer._reset()


def test_top_k_one_samples_the_argmax_with_log_prob_zero():
    engine, _ = _actors(temperature=0.6, top_k=1)
    p = chat_prompt(engine.tokenizer, "q", "What is 1 + 1?")
    [c] = engine.generate([p], n=1, max_new_tokens=8, timeout_s=60).completions
    assert c.logprobs == [0.0] * len(c.token_ids)
    lp, _ = token_logprobs(engine.model, [p.token_ids], [c.token_ids])         # raw T = 1 distribution
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([list(p.token_ids) + c.token_ids])).logits[0]
    n = len(p.token_ids)
    assert c.token_ids == logits[n - 1: n - 1 + len(c.token_ids)].argmax(-1).tolist()


def test_sampling_logprobs_follow_the_hf_warpers():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    full = torch.log_softmax(logits, -1)
    assert torch.allclose(sampling_logprobs(logits, SamplingConfig()), full)
    assert torch.allclose(sampling_logprobs(logits, SamplingConfig(temperature=0.5)), torch.log_softmax(logits * 2, -1))
    # top-p 0.7: probs .644 .237 .087 .032 -> the two smallest (cumulative .119 <= 0.3) are dropped
    two = torch.log_softmax(torch.tensor([3.0, 2.0]), -1)
    got = sampling_logprobs(logits, SamplingConfig(top_p=0.7))
    assert torch.allclose(got[0, :2], two) and got[0, 2:].tolist() == [NEG, NEG]
    got = sampling_logprobs(logits, SamplingConfig(top_k=3))
    assert torch.allclose(got[0, :3], torch.log_softmax(logits[0, :3], -1)) and got[0, 3].item() == NEG
    # top-k then top-p (the order of transformers' and vLLM's samplers); keeps >= 1 token; any leading shape
    got = sampling_logprobs(logits.expand(2, 3, 4), SamplingConfig(temperature=0.5, top_k=3, top_p=0.01))
    assert got.shape == (2, 3, 4) and (got[..., 0] == 0).all() and (got[..., 1:] == NEG).all()


@pytest.mark.parametrize("kw, field", [({"temperature": 0.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                                       ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k")])
def test_bad_sampling_settings_name_the_field(kw, field):
    with pytest.raises(ValueError, match=f"sampling.{field}"):
        SamplingConfig(**kw)
    tok = type("Tok", (), {"eos_token_id": 2, "pad_token_id": 2})()
    with pytest.raises(ValueError, match=f"sampling.{field}"):
        HFEngine(tiny_policy(97), tok, **kw)


def test_the_sampling_config_comes_from_the_actor_spec():
    assert SamplingConfig.from_spec({"temperature": 0.6, "top_p": 0.9, "lr": 1e-6}) == SamplingConfig(0.6, 0, 0.9)
    assert SamplingConfig.from_spec({}) == SamplingConfig(1.0, 0, 1.0)
    assert SamplingConfig.from_spec(SamplingConfig(0.7, 5, 0.5).spec()) == SamplingConfig(0.7, 5, 0.5)
