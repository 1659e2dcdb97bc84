"""The LM substrate (ops/lm): the mixture schedule and the streams, packing and the loss mask, sampled
generation against the distribution it should draw from, and a checkpointed run resumed to the
bit-identical result of an uninterrupted one."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from ops.lm.data import BlockStream, Example, MixedBatches, PackedStream, mixture_counts, pack

# ----------------------------------------------------------------------------------- data


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.25, 1 / 3, 0.5, 0.9, 1.0])
def test_mixture_schedule_realises_the_ratio_exactly(ratio):
    G = 16
    counts = [mixture_counts(s, G, ratio) for s in range(250)]
    assert all(0 <= c <= G for c in counts)
    for steps in (1, 7, 64, 250):  # at every prefix the total is the rounded target: error < 1 sequence
        assert abs(sum(counts[:steps]) - steps * G * ratio) <= 0.5 + 1e-9


def test_block_stream_is_deterministic_across_a_resume():
    tokens = np.arange(10 * 8, dtype=np.uint16)
    whole = BlockStream(tokens, 8, seed=3, name="t").take(25)  # crosses two epoch boundaries
    a = BlockStream(tokens, 8, seed=3, name="t")
    first = a.take(11)
    b = BlockStream(tokens, 8, seed=3, name="t")
    b.taken = 11  # what a resumed run does
    np.testing.assert_array_equal(np.concatenate([first, b.take(14)]), whole)
    # each epoch is a permutation of all blocks
    assert sorted(whole[:10, 0].tolist()) == list(range(0, 80, 8))
    with pytest.raises(ValueError, match="fewer than one block"):
        BlockStream(np.arange(5, dtype=np.uint16), 8, 0, "tiny")


def _examples(n: int) -> list[Example]:
    """Example i: a 3-token prompt (ids 100 + i) and an (i % 3 + 2)-token response (ids 200 + i)."""
    out = []
    for i in range(n):
        r = i % 3 + 2
        out.append(Example(np.array([100 + i] * 3 + [200 + i] * r, np.int64),
                           np.array([0.0] * 3 + [1.0] * r, np.float32)))
    return out


def test_packing_keeps_every_loss_token_and_masks_the_padding():
    exs = _examples(6)                                   # lengths 5, 6, 7, 5, 6, 7
    ids, mask, counts = pack(exs, 12, pad_id=0)
    # greedy in order: [5+6] [7+5] [6] [7] -> 4 rows
    assert counts == {"rows": 4, "examples": 6, "truncated": 0, "dropped": 0, "fill": pytest.approx(36 / 48)}
    assert ids[0, :11].tolist() == [100] * 3 + [200] * 2 + [101] * 3 + [201] * 3 and ids[0, 11] == 0
    assert mask.sum() == sum(e.mask.sum() for e in exs)          # no loss token lost, none added
    assert (mask[ids == 0] == 0).all()                           # padding never carries loss
    np.testing.assert_array_equal(mask[ids >= 200], 1.0)         # every response token does
    np.testing.assert_array_equal(mask[(ids >= 100) & (ids < 200)], 0.0)


def test_mixed_batches_put_the_first_stream_first_and_resume_at_a_position():
    def streams():
        return (PackedStream(_examples(12), 8, 0, seed=2, name="sft"),
                BlockStream(np.arange(40 * 8, dtype=np.uint16) % 50, 8, seed=1, name="general"))

    packed, blocks = streams()
    mb = MixedBatches(packed, blocks, global_batch=4, ratio=0.75)
    steps = [mb.take(s) for s in range(5)]
    for s, (ids, mask) in enumerate(steps):
        n = mixture_counts(s, 4, 0.75)
        assert ids.shape == (4, 8) and ids.dtype == np.int64 and mask.dtype == np.float32
        assert (ids[:n] >= 100).any(axis=1).all()                   # packed rows first ...
        assert (ids[n:] < 50).all() and (mask[n:] == 1).all()       # ... then corpus blocks, all of them loss
    mb2 = MixedBatches(*streams(), 4, 0.75)
    for s in range(2):
        mb2.take(s)
    pos_after_2 = mb2.position()
    assert pos_after_2 == {"first": 6, "second": 2} and pos_after_2["first"] == sum(mixture_counts(s, 4, 0.75) for s in range(2))
    mb3 = MixedBatches(*streams(), 4, 0.75)
    mb3.seek(json.loads(json.dumps(pos_after_2)))                  # the position as a checkpoint stores it
    for s in range(2, 5):
        np.testing.assert_array_equal(mb3.take(s)[0], steps[s][0])
    with pytest.raises(ValueError, match="outside"):
        MixedBatches(packed, blocks, 4, 1.5)
    with pytest.raises(ValueError, match="missing"):
        MixedBatches(packed, None, 4, 0.75)


def test_sequence_loss_counts_only_loss_tokens_each_sequence_equally():
    import math

    import torch

    from ops.lm.train import sequence_loss

    V = 4
    logits = torch.zeros(2, 4, V)                      # uniform: every token costs log V ...
    logits[0, 1, 3] = 10.0                             # ... except token 2 of row 0 (predicted at position 1)
    ids = torch.tensor([[0, 1, 3, 2], [0, 1, 2, 3]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1.0]])
    p = math.exp(10) / (math.exp(10) + 3)
    row0 = (-math.log(p) + math.log(V)) / 2            # two loss tokens, their mean
    row1 = math.log(V)
    assert sequence_loss(logits, ids, mask).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    logits[1, 0] = 7.0                                 # a prompt position changes nothing
    assert sequence_loss(logits, ids, mask).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)


# ----------------------------------------------------------------------------------- generation


class _FixedLogits:
    """A stand-in LM whose next-token logits are ``logits`` at every position."""

    def __init__(self, logits):
        self.logits = logits

    def __call__(self, input_ids, attention_mask=None, position_ids=None):
        return SimpleNamespace(logits=self.logits.expand(input_ids.shape[0], input_ids.shape[1], -1))


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("temperature,top_k,top_p,support", [
    (1.0, 0, 1.0, [0, 1, 2, 3, 4]),
    (0.6, 0, 1.0, [0, 1, 2, 3, 4]),
    (1.0, 2, 1.0, [0, 1]),                 # top-k keeps the 2 most likely
    (1.0, 0, 0.8, [0, 1, 2]),              # p = .563, .207, .126, .076, .028: the nucleus reaching 0.8
    (2.0, 3, 0.9, [0, 1, 2]),
])
def test_sampling_draws_from_the_tempered_filtered_distribution(temperature, top_k, top_p, support):
    import torch

    from ops.lm.generate import generate

    raw = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -1e9])   # token 5 is end-of-text and never drawn
    model = _FixedLogits(torch.tensor(raw, dtype=torch.float32))
    n = 20_000
    g = torch.Generator().manual_seed(7)
    out = generate(model, [[1]] * n, eot_id=5, max_new_tokens=1, n_positions=8, temperature=temperature, top_k=top_k,
                   top_p=top_p, generator=g)
    drawn = np.array([o[0] for o in out])
    assert set(np.unique(drawn)) == set(support)       # nothing outside the kept tokens, every kept one drawn
    expected = np.zeros(6)
    expected[support] = _softmax(raw[:5] / temperature)[support]
    expected /= expected.sum()
    freq = np.bincount(drawn, minlength=6) / n
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert (np.abs(freq - expected) <= 4.5 * sigma + 1e-12).all(), (freq, expected)
    again = generate(model, [[1]] * 50, eot_id=5, max_new_tokens=1, n_positions=8, temperature=temperature,
                     top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(7))
    assert again == out[:50]                            # same generator seed, same draws


def test_greedy_generation_takes_the_argmax_and_stops_at_end_of_text():
    import torch

    from ops.lm.generate import generate

    class Counting:                                     # next token = last token + 1; 4 is end-of-text
        def __call__(self, input_ids, attention_mask=None, position_ids=None):
            return SimpleNamespace(logits=torch.nn.functional.one_hot((input_ids + 1) % 6, 6).float() * 5)

    assert generate(Counting(), [[0], [2, 3], [1]], eot_id=4, max_new_tokens=5, n_positions=16) == [[1, 2, 3], [], [2, 3]]
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(Counting(), [[0]], 4, 2, 16, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        generate(Counting(), [[0]], 4, 2, 16, temperature=1.0, top_p=0.0)


def test_completion_logprobs_agree_with_the_response_loss():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from ops.lm.evaluate import completion_logprobs, response_losses

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(vocab_size=30, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
    prompts, golds = [[1, 2, 3], [4, 5]], [[6, 7], [8, 9, 10]]
    with torch.no_grad():
        lp = completion_logprobs(m, prompts, golds, 0, 16)
        losses = response_losses(m, prompts, golds, 0, 16)
        full = torch.log_softmax(m(input_ids=torch.tensor([[1, 2, 3, 6, 7]])).logits[0], -1)
    assert [len(x) for x in lp] == [2, 3]
    assert lp[0] == pytest.approx([full[2, 6].item(), full[3, 7].item()], abs=1e-5)
    assert [-np.mean(x) for x in lp] == pytest.approx(losses, rel=1e-5)


# ----------------------------------------------------------------------------------- model


def test_parameter_counts_of_the_probe_sizes():
    from ops.lm.model import gpt2, param_counts
    from ops.mixture.probe import SIZES

    # docs/mixture.md, "Probe grid": N from 6,592 (xs) to 447,552 (l); size m ~289k in all at 2,048 tokens
    assert param_counts(gpt2(2048, 128, 0, SIZES["xs"], 0))[0] == 6592
    assert param_counts(gpt2(2048, 128, 0, SIZES["l"], 0))[0] == 447552
    assert param_counts(gpt2(2048, 128, 0, SIZES["m"], 0)) == (150080, 289344)


def test_model_folder_round_trip(tmp_path):
    import torch

    from ops.lm.model import gpt2, load_model, save_model
    from ops.lm.train import adamw

    m = gpt2(50, 16, 0, {"n_embd": 16, "n_layer": 1, "n_head": 2}, seed=3)
    save_model(m, tmp_path / "m", adamw(m, 1e-3, 0.0))
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors", "optimizer.pt"]
    back = load_model(tmp_path / "m")
    for (k, a), (_, b) in zip(m.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    with pytest.raises(FileNotFoundError, match="model.safetensors does not exist"):
        load_model(tmp_path / "nothing")


# ----------------------------------------------------------------------------------- the loop


def _run(state_dir, logs, fp="fp", lr=1e-2):
    """A tiny GPT-2 *with dropout* (so the RNG matters) on a 50/50 mixture of two block streams."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from ops.lm.checkpoint import LMState
    from ops.lm.schedule import warmup_cosine
    from ops.lm.train import DataParallel, Trainer, adamw, lambda_lr, token_mean_loss

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=8, n_embd=16, n_layer=1, n_head=2,
                                       resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2))
    opt = adamw(model, lr, 0.01)
    sched = lambda_lr(opt, warmup_cosine(2, 10, 0.1))
    rng = np.random.default_rng(0)
    batches = MixedBatches(BlockStream(rng.integers(0, 20, 400).astype(np.uint16), 8, 1, "a"),
                           BlockStream(rng.integers(20, 40, 400).astype(np.uint16), 8, 2, "b"), 4, 0.5)
    return Trainer(DataParallel.start(4), model, opt, sched, batches, token_mean_loss, state=LMState(state_dir, fp),
                   history=[], name="tiny", log=logs.append)


def _params(trainer):
    return {k: v.clone() for k, v in trainer.unwrapped.state_dict().items()}


def test_a_resumed_run_reaches_the_uninterrupted_result_bit_for_bit(tmp_path, monkeypatch):
    import torch

    from ops.lm.checkpoint import describe_saved

    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    logs: list[str] = []
    record = lambda t: (lambda step, loss: t.history.append([step, loss]))  # noqa: E731

    whole = _run(tmp_path / "whole", logs)
    whole.train(10, record(whole))
    want, want_history = _params(whole), whole.history

    first = _run(tmp_path / "run" / "runs" / "tiny", logs)
    first.train(6, record(first))
    first.save()
    assert describe_saved(tmp_path / "run") == "checkpoints: tiny at step 6"
    del first                                            # the launch dies here
    torch.manual_seed(12345)                             # whatever the next process's RNG is
    resumed = _run(tmp_path / "run" / "runs" / "tiny", logs)
    assert resumed.resumed_from == 6 and resumed.step == 6 and logs[-1] == "tiny: resumed at step 6"
    resumed.train(10, record(resumed))
    assert resumed.history == want_history               # losses of steps 1..10, the first 6 from the checkpoint
    got = _params(resumed)
    assert all(torch.equal(got[k], want[k]) for k in want)

    # without the RNG state the dropout masks differ: the restored RNG is what makes it exact
    state = tmp_path / "run" / "runs" / "tiny" / "state"
    for f in state.glob("rng-*.pt"):
        f.unlink()
    no_rng = _run(tmp_path / "run" / "runs" / "tiny", logs)
    no_rng.train(10)
    assert not all(torch.equal(_params(no_rng)[k], want[k]) for k in want)

    # a checkpoint of another spec is not resumed from, and the log says why
    other = _run(tmp_path / "run" / "runs" / "tiny", logs, fp="other")
    assert other.step == 0 and "from another spec" in logs[-1]
    resumed.finish()
    assert not state.exists() and describe_saved(tmp_path / "run") == ""


def test_published_record_is_reused_only_with_its_fingerprint(tmp_path):
    from ops.lake import write_json_atomic
    from ops.lm.checkpoint import published

    logs: list[str] = []
    write_json_atomic({"fingerprint": "abc", "loss": 1.5}, tmp_path / "metrics.json")
    assert published(tmp_path / "metrics.json", "abc", logs.append, "run x") == {"fingerprint": "abc", "loss": 1.5}
    assert logs == ["run x: reused (fingerprint abc)"]
    assert published(tmp_path / "metrics.json", "def", logs.append, "run x") is None
    assert published(tmp_path / "metrics.json", "abc", logs.append, "run x", needs=(tmp_path / "pred.parquet",)) is None
    assert published(tmp_path / "none.json", "abc", logs.append, "run x") is None
