"""The verifier keeps its per-item timeout (case verify-huge-power-timeout) and reads only the final answer,
outside <think> blocks, with the rule the RL reward shares (case reward-think-block)."""

import time

import pytest

from ops.curation import verify as V


def _timed(items, timeout_s):
    t = time.perf_counter()
    res = V.verify_many(items, timeout_s=timeout_s, workers=2)
    return res, time.perf_counter() - t


def test_case_verify_huge_power_timeout(curation_cases):
    inp = curation_cases["verify-huge-power-timeout"]["input"]
    timeout = float(inp["timeout_s"])
    huge = V.VerifyItem("huge", inp["gold"], None, inp["prediction"])
    fast = [V.VerifyItem(f"f{i}", str(i), None, f"$\\boxed{{{i}}}$") for i in range(7)]
    base_res, base = _timed(fast, timeout)                 # pool start-up and seven quick items
    assert [r["status"] for r in base_res] == ["verified"] * 7
    alone, t_alone = _timed([huge], timeout)
    chunk, t_chunk = _timed(fast[:3] + [huge] + fast[3:], timeout)   # inside a chunk of 8
    for res in (alone, [chunk[3]]):
        assert res[0]["status"] in {"wrong", "timeout"}     # never verified
    assert [r["status"] for r in chunk[:3] + chunk[4:]] == ["verified"] * 7
    # it costs its timeout plus a fixed overhead, well under 2x the timeout; the former chunked path charged
    # about 2x alone and (chunk + 1)x = 9x inside a chunk of 8
    assert t_alone - base < 2 * timeout, (t_alone, base)
    assert t_chunk - base < 2 * timeout, (t_chunk, base)


THINK_CASE = [  # tests/cases/training.json, reward-think-block (gold 4), through the curation verifier
    ("<think>Let me compute 2+2.</think> The answer is \\boxed{4}", "verified"),
    ("<think>maybe \\boxed{4}</think> The answer is 5.", "wrong"),
    ("<think>maybe \\boxed{5}</think> The answer is \\boxed{4}", "verified"),
    ("<think> unfinished ... \\boxed{4}", "unparseable_prediction"),  # unclosed block: no final answer
]


@pytest.mark.parametrize("response, status", THINK_CASE)
def test_case_reward_think_block_in_curation(response, status):
    assert V.verify_one(V.VerifyItem("k", "4", None, response))["status"] == status


def test_one_think_block_rule_for_curation_and_rl():
    from ops.rl import reward

    assert reward.final_answer_text is V.final_answer_text
    assert V.final_answer_text(None) == ""
    mc = V.VerifyItem("k", "B", None, "<think>the answer is (A)</think> The answer is (B).", "multiple_choice")
    assert V.verify_one(mc)["status"] == "verified"
