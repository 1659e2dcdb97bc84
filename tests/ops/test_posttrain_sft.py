"""Post-training SFT mechanics on a tiny GPT-2: the loss mask, packing, a loss that falls, and a
crashed run that resumes to the bit-identical result."""

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ops.lm.data import PackedStream, pack
from ops.lm.schedule import LrSchedule
from ops.posttrain.data import PROMPT, encode_example

PROBLEMS = [f"What is the units digit of {n}?" for n in range(1000, 1060)]
RESPONSES = [f"\\boxed{{{n % 10}}}" for n in range(1000, 1060)]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from ops.mixture.tokens import EOT, _encode, train_tokenizer

    d = tmp_path_factory.mktemp("tok")
    texts = [PROMPT.format(problem=p) + " " + r for p, r in zip(PROBLEMS, RESPONSES)] + ["the dress fits well"] * 20
    tok = train_tokenizer(texts, vocab_size=300, min_frequency=1)
    tok.save(str(d / "tokenizer.json"))
    np.save(d / "general_train.npy", _encode(tok, ["the dress fits well and the fabric is soft"] * 200))
    (d / "manifest.json").write_text(json.dumps({"eot_id": tok.token_to_id(EOT)}))
    return d


def _tok(tok_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tok_dir / "tokenizer.json"))


def test_loss_mask_covers_exactly_the_response_tokens(tok_dir):
    tok = _tok(tok_dir)
    eot = tok.token_to_id("<|endoftext|>")
    ex = encode_example(tok, "What is the units digit of 4242?", "\\boxed{2}", eot)
    prompt_ids = tok.encode(PROMPT.format(problem="What is the units digit of 4242?")).ids
    n = len(prompt_ids)
    assert ex.ids[:n].tolist() == prompt_ids and ex.mask[:n].sum() == 0
    assert ex.mask[n:].min() == 1 and ex.ids[-1] == eot
    assert tok.decode(ex.ids[ex.mask == 1][:-1].tolist()) == " \\boxed{2}"


def test_packing_keeps_examples_whole_and_counts_truncation(tok_dir):
    tok = _tok(tok_dir)
    eot = tok.token_to_id("<|endoftext|>")
    exs = [encode_example(tok, p, r, eot) for p, r in zip(PROBLEMS[:10], RESPONSES[:10])]
    L = len(exs[0].ids)
    ids, mask, counts = pack(exs, 2 * L + 3, eot)
    assert counts["rows"] == 5 and counts["examples"] == 10 and counts["truncated"] == 0
    assert mask.sum() == sum(e.mask.sum() for e in exs)  # no loss token lost, none added on padding
    assert (ids[:, 2 * L:] == eot).all() and mask[:, 2 * L:].sum() == 0
    ids, mask, counts = pack(exs[:2], L - 2, eot)  # too long: cut, still carrying response tokens
    assert counts["truncated"] == 2 and counts["rows"] == 2
    _, _, counts = pack(exs[:1], 3, eot)  # only prompt tokens fit: dropped
    assert counts["dropped"] == 1 and counts["rows"] == 0


def test_packed_stream_resumes_deterministically(tok_dir):
    tok = _tok(tok_dir)
    eot = tok.token_to_id("<|endoftext|>")
    exs = [encode_example(tok, p, r, eot) for p, r in zip(PROBLEMS[:12], RESPONSES[:12])]
    whole = PackedStream(exs, 64, eot, seed=3).take(17)[0]  # crosses epochs
    a = PackedStream(exs, 64, eot, seed=3)
    first = a.take(5)[0]
    b = PackedStream(exs, 64, eot, seed=3)
    b.taken = 5
    np.testing.assert_array_equal(np.concatenate([first, b.take(12)[0]]), whole)


def _tiny_model(path: Path, vocab: int) -> None:
    from safetensors.torch import save_model
    from transformers import GPT2Config, GPT2LMHeadModel

    import torch

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_positions=48, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    path.mkdir(parents=True)
    m = GPT2LMHeadModel(cfg)
    save_model(m, str(path / "model.safetensors"))
    cfg.to_json_file(str(path / "config.json"))


def _plan(tmp_path, tok_dir, out: str, ratio: float = 0.75, eval_init: bool = False) -> Path:
    from ops.posttrain.sft import SftPlan

    train = pl.DataFrame({"problem": PROBLEMS[:40], "response": RESPONSES[:40]})
    ev = pl.DataFrame({"item_id": [f"e{i}" for i in range(6)], "problem": PROBLEMS[40:46], "response": RESPONSES[40:46]})
    train.write_parquet(tmp_path / "train.parquet")
    ev.write_parquet(tmp_path / "eval.parquet")
    plan = SftPlan(data_dir=str(tok_dir), eval_path=str(tmp_path / "eval.parquet"), global_batch=4, steps=12,
                   schedule=LrSchedule(lr=5e-3, warmup_steps=2, min_lr_ratio=0.1, weight_decay=0.01), checkpoint_every=4, log_every=4, domain_ratio=ratio, max_new_tokens=6,
                   runs=[{"key": out, "init_dir": str(tmp_path / "init"), "train_path": str(tmp_path / "train.parquet"),
                          "out_dir": str(tmp_path / out), "eval_init": eval_init}])
    p = tmp_path / f"{out}.json"
    p.write_text(plan.to_json())
    return p


def _main(plan: Path) -> int:
    """The worker's main as the launch protocol calls it; the run folder is the same on every
    launch of one plan (like a run lineage)."""
    from ops.posttrain import sft

    return sft.main(["--spec", str(plan), "--out", str(plan.with_suffix(".run")), "--fingerprint", "fp"])


def test_sft_loss_falls_and_a_crashed_run_resumes_bit_exact(tmp_path, tok_dir, monkeypatch):
    from ops.lm.train import SimulatedCrash

    _tiny_model(tmp_path / "init", _tok(tok_dir).get_vocab_size())
    monkeypatch.delenv("DAGSTER_PIPES_CONTEXT", raising=False)
    assert _main(_plan(tmp_path, tok_dir, "straight", eval_init=True)) == 0
    straight = json.loads((tmp_path / "straight/metrics.json").read_text())
    curve = [p["loss"] for p in straight["curve"]]
    assert len(curve) == 3 and curve[-1] < curve[0] * 0.8, curve
    # general replay really mixed in: 25% of the sequences are general blocks
    assert straight["domain_ratio"] == 0.75 and straight["world_size"] == 1
    preds = pl.read_parquet(tmp_path / "straight/predictions.parquet")
    assert preds["item_id"].to_list() == [f"e{i}" for i in range(6)] and preds["response_loss"].is_finite().all()
    assert (tmp_path / "straight/predictions_init.parquet").exists()

    monkeypatch.setenv("CRUCIBLE_SFT_CRASH_AFTER_STEP", "4")
    plan = _plan(tmp_path, tok_dir, "crashed")
    with pytest.raises(SimulatedCrash):
        _main(plan)
    state = tmp_path / "crashed.run" / "runs" / "crashed" / "state"        # in the launch's run folder
    saved = json.loads((state / "state.json").read_text())
    assert saved["step"] == 4 and saved["data"]["first"] + saved["data"]["second"] == 4 * 4  # 4 steps of 4 rows
    assert (state / saved["model_file"]).exists() and not (tmp_path / "crashed/model.safetensors").exists()
    monkeypatch.delenv("CRUCIBLE_SFT_CRASH_AFTER_STEP")
    assert _main(plan) == 0
    resumed = json.loads((tmp_path / "crashed/metrics.json").read_text())
    assert resumed["curve"] == straight["curve"]
    assert (tmp_path / "crashed/model.safetensors").read_bytes() == (tmp_path / "straight/model.safetensors").read_bytes()
    assert not state.exists()
    result = json.loads((tmp_path / "crashed.run" / "result.json").read_text())     # what the asset reads
    assert result["runs"]["crashed"]["curve"] == straight["curve"] and result["fingerprint"] == "fp"
    # a finished run with the same fingerprint is reused, not retrained
    mtime = os.path.getmtime(tmp_path / "crashed/model.safetensors")
    assert _main(plan) == 0 and os.path.getmtime(tmp_path / "crashed/model.safetensors") == mtime


def test_a_bad_spec_fails_naming_the_file_and_the_field(tmp_path, tok_dir):
    plan = _plan(tmp_path, tok_dir, "bad")
    spec = json.loads(plan.read_text())
    plan.write_text(json.dumps({**spec, "domain_ratio": 1.5}))
    with pytest.raises(ValueError, match=r"bad\.json: sft\.domain_ratio must be in \[0, 1\], got 1\.5"):
        _main(plan)
    plan.write_text(json.dumps({**spec, "runs": [{"key": "r"}]}))
    with pytest.raises(ValueError, match=r"sft run 'r' lacks \['init_dir', 'train_path', 'out_dir'\]"):
        _main(plan)


def test_batched_greedy_decoding_matches_one_at_a_time(tmp_path, tok_dir):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ops.lm.generate import generate as greedy_decode

    _tiny_model(tmp_path / "m", _tok(tok_dir).get_vocab_size())
    torch.manual_seed(1)
    m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(tmp_path / "m"))).eval()
    tok = _tok(tok_dir)
    prompts = [tok.encode(PROMPT.format(problem=p)).ids for p in ["What is 1?", PROBLEMS[0], "Is 7 a factor of 49?"]]
    with torch.no_grad():
        batched = greedy_decode(m, prompts, 0, 5, 48)
        single = [greedy_decode(m, [p], 0, 5, 48)[0] for p in prompts]
    assert batched == single


def test_cached_greedy_decoding_matches_the_substrate_greedy_decoder(tmp_path, tok_dir):
    """ops.posttrain.decode.greedy_cached (one position per new token, key/value cache) gives the
    tokens of ops.lm.generate.generate (full recomputation) on a trained model: prompts of mixed
    lengths (left padding), one longer than the context allows (kept tail), rows that stop early."""
    import torch

    from ops.lm.generate import generate
    from ops.lm.model import load_model
    from ops.posttrain.decode import greedy_cached

    _tiny_model(tmp_path / "init", _tok(tok_dir).get_vocab_size())
    assert _main(_plan(tmp_path, tok_dir, "trained")) == 0         # a model that emits answers and end-of-text
    m = load_model(tmp_path / "trained").eval()
    tok = _tok(tok_dir)
    eot = tok.token_to_id("<|endoftext|>")
    prompts = [tok.encode(PROMPT.format(problem=p)).ids for p in PROBLEMS[40:52]] + [list(range(3, 60))]
    with torch.no_grad():
        for new in (1, 6):
            want = generate(m, prompts, eot, new, 48)
            assert greedy_cached(m, prompts, eot, new, 48) == want
    assert any(0 < len(w) < 6 for w in want)                      # some rows stopped at end-of-text
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_cached(m, prompts, eot, 48, 48)
