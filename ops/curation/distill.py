"""Teacher distillation: k samples per problem, each verified against the reference answer.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 4 — strong teachers write long chain-of-thought
responses; only responses whose final answer verifies are kept. Here a row's samples are verified
with :mod:`ops.curation.verify` (math-verify in worker processes with a wall-clock timeout; letters
for multiple choice). A request that failed (timeout, 5xx after retries, budget) is counted as
``failed`` — never as a wrong answer.

Selection of the kept response(s): among a row's verified samples, the ``keep`` shortest (by
completion tokens, then characters, then sample index). Shorter verified chains are preferred
because weak teachers pad with repetition; every verified sample stays in ``teacher_responses``.
"""

from __future__ import annotations

import hashlib

from ops.teacher.client import ChatRequest, ChatResult
from ops.teacher.prompts import solve_messages

from .verify import VerifyItem, verify_many


def select_rows(rows: list[dict], max_rows: int, seed: int = 0) -> list[dict]:
    """A deterministic pseudo-random slice of ``max_rows`` rows (seeded hash of problem_id), so the
    slice spreads over sources and strata and does not depend on input order."""
    def h(r):
        return hashlib.sha256(f"{seed}:{r['problem_id']}".encode()).hexdigest()

    return sorted(rows, key=h)[: max(0, max_rows)]


def build_requests(rows: list[dict], k: int, params: dict, templates: dict[str, str] | None = None) -> list[ChatRequest]:
    """``k`` requests per row (sample index 0..k-1), tagged with the row's problem_id; ``templates``
    override the default prompt per answer type."""
    if k < 1:
        raise ValueError(f"teacher.k_samples must be >= 1, got {k}")
    return [
        ChatRequest.make(solve_messages(r["problem"], r["answer_type"], templates), params, sample_index=i, tag=r["problem_id"])
        for r in rows
        for i in range(k)
    ]


def verify_samples(rows: list[dict], results: list[ChatResult], timeout_s: float, workers: int) -> list[dict]:
    """One record per sample: problem_id, sample_index, status (verified | wrong |
    unparseable_prediction | failed | timeout | error), text, completion_tokens, error, cached."""
    by_id = {r["problem_id"]: r for r in rows}
    items, ok_idx = [], []
    for n, res in enumerate(results):
        if res.status == "ok":
            r = by_id[res.request.tag]
            items.append(VerifyItem(f"{n}", r["answer"], r.get("solution"), res.text or "", r["answer_type"]))
            ok_idx.append(n)
    verdicts = {int(v["key"]): v["status"] for v in verify_many(items, timeout_s=timeout_s, workers=workers)} if items else {}
    out = []
    for n, res in enumerate(results):
        out.append({
            "problem_id": res.request.tag,
            "sample_index": res.request.sample_index,
            "status": verdicts.get(n, "failed") if res.status == "ok" else "failed",
            "text": res.text,
            "completion_tokens": res.completion_tokens,
            "chars": len(res.text or ""),
            "error": res.error,
            "cached": res.cached,
        })
    return out


def summarize(samples: list[dict], keep: int = 1) -> dict[str, dict]:
    """Per problem_id: n_samples, n_verified, n_failed, pass_rate (verified / answered, None when
    nothing was answered) and ``best`` (the kept verified samples, shortest first)."""
    per: dict[str, dict] = {}
    for s in samples:
        p = per.setdefault(s["problem_id"], {"n_samples": 0, "n_verified": 0, "n_failed": 0, "verified": []})
        p["n_samples"] += 1
        if s["status"] == "verified":
            p["n_verified"] += 1
            p["verified"].append(s)
        elif s["status"] in ("failed", "timeout", "error"):
            p["n_failed"] += 1
    for p in per.values():
        answered = p["n_samples"] - p["n_failed"]
        p["pass_rate"] = p["n_verified"] / answered if answered else None
        p["best"] = sorted(p.pop("verified"), key=lambda s: (s["completion_tokens"] or 0, s["chars"], s["sample_index"]))[:keep]
    return per
