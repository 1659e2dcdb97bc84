"""The scratchpad task of the small RL policy (docs/rl_policy.md): problems, solutions, tokenizer,
the multi-turn form and the held-out evaluation."""

import random
import statistics

import pytest

from ops.rl import scratchpad as sp


def test_solution_is_the_subtraction_chain():
    assert sp.chain(7, 45) == ["38", "31", "24", "17", "10", "3"]
    assert sp.solution(7, 45) == "\n38\n31\n24\n17\n10\n3\n\\boxed{3}"
    assert sp.solution(5, 3) == "\n\\boxed{3}"                      # N < a: no line, the answer at once
    p = sp.Problem("x", 9, 100)
    assert (p.prompt, p.answer, p.lines) == ("9:100=", "1", 11)


def test_rl_distribution_has_a_long_tail():
    ps = sp.problems(0, 2000)
    lens = [sp.response_length(p) for p in ps]
    assert all(2 <= p.a <= 9 and 1 <= p.lines <= 60 for p in ps)
    assert statistics.median(lens) <= 25 and max(lens) >= 200     # longest >= 8x the median
    # batches of 64 prompts: the longest response is >= 8x the median in most of them
    ratios = [max(lens[k:k + 64]) / statistics.median(lens[k:k + 64]) for k in range(0, 1984, 64)]
    assert statistics.median(ratios) >= 8
    assert [p.uid for p in sp.problems(3, 5)] == [f"sub-3-{k}" for k in range(5)]
    assert sp.problems(3, 5) == sp.problems(3, 5) and sp.problems(3, 5) != sp.problems(4, 5)


def test_sampling_arguments_are_checked():
    with pytest.raises(ValueError, match="scratchpad.max_lines"):
        sp.sample_lines(random.Random(0), 0, 1.0)
    with pytest.raises(ValueError, match="scratchpad.alpha"):
        sp.sample_lines(random.Random(0), 10, -1.0)


def test_tokenizer_is_character_level_and_round_trips(tmp_path):
    tok = sp.build_tokenizer(tmp_path)
    assert len(tok) == len(sp.CHARS) + 1 and tok.eos_token_id == tok.pad_token_id == 0
    text = "7:45=" + sp.solution(7, 45)
    ids = sp.encode(tok, text)
    assert len(ids) == len(text) and tok.decode(ids) == text
    from ops.rl.policy import load_tokenizer

    again = load_tokenizer(tmp_path)
    assert sp.encode(again, text) == ids
    with pytest.raises(ValueError, match="'\\*'"):
        sp.encode(tok, "7*45=")


def test_tool_turns_concatenate_to_the_checked_trajectory():
    turns = sp.tool_turns(3, 50)                                   # q = 16 lines: 8 + 8 + the answer
    assert len(turns) == 50 // 3 // sp.TURN_LINES + 1 == 3
    assert [o for _, o in turns] == [sp.CHECK_OK, sp.CHECK_OK, None]
    assert all(t.endswith("?") and t.count("\n") == sp.TURN_LINES for t, _ in turns[:-1])
    assert "".join(t for t, _ in turns).replace("?", "") == sp.solution(3, 50)


def test_heldout_accuracy_scores_the_model_text():
    """A model that always writes the correct answer of one problem: accuracy is exactly the share
    of problems with that answer text."""
    import torch

    tok = sp.build_tokenizer()
    target = sp.encode(tok, "\n\\boxed{1}") + [tok.eos_token_id]

    class Fixed(torch.nn.Module):
        def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
            out = torch.tensor(target[:max_new_tokens]).repeat(len(input_ids), 1)
            return torch.cat([input_ids, out], 1)

    probs = [sp.Problem("a", 3, 4), sp.Problem("b", 3, 5), sp.Problem("c", 2, 1), sp.Problem("d", 5, 40)]
    r = sp.heldout_accuracy(Fixed(), tok, probs, temperature=0.0)
    assert r["accuracy"] == 0.5 and r["n"] == 4 and r["mean_len"] == len(target)
    assert r["by_lines"] == {"1": [2 / 3, 3], "8-15": [0.0, 1]}      # q = 1, 1, 0 and 8
    with pytest.raises(ValueError):
        sp.heldout_accuracy(Fixed(), tok, [])
