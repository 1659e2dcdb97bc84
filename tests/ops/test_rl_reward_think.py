"""The math reward reads the final answer outside ``<think>`` blocks (case reward-think-block)."""

import pytest

from ops.rl.reward import RewardItem, final_answer_text, reward_counts, score_one

CASE = [  # tests/cases/training.json, reward-think-block (gold 4)
    ("<think>Let me compute 2+2.</think> The answer is \\boxed{4}", 1.0, "verified"),
    ("<think>maybe \\boxed{4}</think> The answer is 5.", 0.0, "unparseable"),
    ("<think>maybe \\boxed{5}</think> The answer is \\boxed{4}", 1.0, "verified"),
    ("<think> unfinished ... \\boxed{4}", 0.0, "unparseable"),       # unclosed block: no final answer
]


@pytest.mark.parametrize("response, score, status", CASE)
def test_case_reward_think_block(response, score, status):
    r = score_one(RewardItem("k", response, "4"))
    assert (r.score, r.status) == (score, status)
    # the case text's doubled backslashes score the same
    r = score_one(RewardItem("k", response.replace("\\", "\\\\"), "4"))
    assert (r.score, r.status) == (score, status)


def test_a_wrong_final_answer_is_wrong_not_unparseable():
    res = [score_one(RewardItem(str(i), t, "4")) for i, t in enumerate(
        ["<think>\\boxed{4}</think> so \\boxed{5}", "<think>\\boxed{4}</think> so 4", "\\boxed{4}"])]
    assert [(r.score, r.status) for r in res] == [(0.0, "wrong"), (0.0, "unparseable"), (1.0, "verified")]
    c = reward_counts(res)
    assert (c["verified"], c["wrong"], c["unparseable"]) == (1, 1, 1)


def test_final_answer_text_rules():
    assert final_answer_text("a <think>b</think> c <think>d</think> e") == "a  c  e"
    assert final_answer_text("<THINK>b</Think>c") == "c"
    # a chat template that opens the block in the prompt: the response starts inside it
    assert final_answer_text("reasoning \\boxed{5}</think> final \\boxed{4}") == " final \\boxed{4}"
    assert final_answer_text("ok <think> never closed \\boxed{4}") == "ok "
    assert final_answer_text("no tags \\boxed{4}") == "no tags \\boxed{4}"
    assert score_one(RewardItem("k", "reasoning \\boxed{4}</think> the answer is 5", "4")).status == "unparseable"
