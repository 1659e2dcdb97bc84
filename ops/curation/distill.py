"""Teacher distillation: k samples per problem, each verified against the reference answer.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 4 — strong teachers write long chain-of-thought
responses; only responses whose final answer verifies are kept. Here a row's samples are verified
with :mod:`ops.curation.verify` (math-verify in worker processes with a wall-clock timeout; letters
for multiple choice). A request that failed (timeout, 5xx after retries, budget) is counted as
``failed`` — never as a wrong answer.

Selection of the kept response(s): among a row's verified samples, the ``keep`` shortest (by
completion tokens, then characters, then sample index). Shorter verified chains are preferred
because weak teachers pad with repetition; every verified sample stays in ``teacher_responses``.

Seeded samples (docs/curation.md, "Seeded distillation"): sample ``i`` of problem ``p`` in a run
with seed ``s`` is requested with the sampler seed :func:`teacher_seed` ``(s, p, i)``, so two runs
with the same seed ask the same questions with the same seeds and, from a teacher that honours
seeds, get the same texts back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ops.teacher.requests import ChatRequest, ChatResult
from ops.teacher.prompts import solve_messages, validate_templates

from .verify import VerifyItem, verify_stable


@dataclass
class DistillParams:
    """Parameters of distillation (the ``distilled_problems`` run config).

    Raises:
        ValueError: a field out of range or a bad template (the message names it).
    """

    verify_timeout_s: float = 10.0
    """Wall-clock seconds per verification (> 0; math-verify runs in worker processes)."""
    workers: int = 2
    """Verification worker processes (>= 1)."""
    teacher: bool = True
    """Run the teacher path (False: reference path only)."""
    teacher_max_rows: int = 24
    """Rows sent to the teacher (>= 0; a seeded slice); sized so the embedded teacher adds < 4 min."""
    teacher_also_reference_rows: bool = False
    """Also ask the teacher for rows that have a verified reference solution (long-CoT responses)."""
    k_samples: int = 2
    """Teacher samples per row (>= 1)."""
    temperature: float = 0.7
    """Sampling temperature of the teacher requests (>= 0; 0 = greedy)."""
    max_tokens: int = 160
    """Completion tokens per sample (>= 1)."""
    keep_per_problem: int = 1
    """Verified teacher responses kept per problem in distilled_problems (>= 1; all stay in
    teacher_responses)."""
    seed: int = 0
    """Run seed: the teacher slice and the sampler seed of every teacher request (with problem_id
    and sample index; ops/curation/distill.py:teacher_seed)."""
    prompt_templates: dict[str, str] = field(default_factory=dict)
    """Per answer type (numeric, expression, text, proof, multiple_choice), a template with
    "{problem}" replacing ops/teacher/prompts.py:TEMPLATES (final answer in \\boxed{})."""

    def __post_init__(self):
        for name, ok, rule in (("verify_timeout_s", self.verify_timeout_s > 0, "> 0"), ("workers", self.workers >= 1, ">= 1"),
                               ("teacher_max_rows", self.teacher_max_rows >= 0, ">= 0"),
                               ("k_samples", self.k_samples >= 1, ">= 1"), ("temperature", self.temperature >= 0, ">= 0"),
                               ("max_tokens", self.max_tokens >= 1, ">= 1"),
                               ("keep_per_problem", self.keep_per_problem >= 1, ">= 1")):
            if not ok:
                raise ValueError(f"distilled_problems.{name} out of range: {getattr(self, name)} (must be {rule})")
        validate_templates(self.prompt_templates)


def teacher_seed(run_seed: int, problem_id: str, sample_index: int) -> int:
    """The sampler seed of one teacher request, in [0, 2**31) (fits the signed 32-bit seed some
    servers keep).

    The first 4 bytes (big-endian, top bit cleared) of
    ``sha256(f"crucible-teacher-seed/v1:{run_seed}:{sample_index}:{problem_id}")``: stable across
    processes, machines and Python versions (unlike ``hash()``), independent of row order and of
    which other rows run. ``problem_id`` goes last so that a ':' in it cannot collide.
    """
    blob = f"crucible-teacher-seed/v1:{int(run_seed)}:{int(sample_index)}:{problem_id}".encode("utf-8")
    return int.from_bytes(hashlib.sha256(blob).digest()[:4], "big") & 0x7FFF_FFFF


def select_rows(rows: list[dict], max_rows: int, seed: int = 0) -> list[dict]:
    """A deterministic pseudo-random slice of ``max_rows`` rows (seeded hash of problem_id), so the
    slice spreads over sources and strata and does not depend on input order."""
    def h(r):
        return hashlib.sha256(f"{seed}:{r['problem_id']}".encode()).hexdigest()

    return sorted(rows, key=h)[: max(0, max_rows)]


def build_requests(rows: list[dict], k: int, params: dict, templates: dict[str, str] | None = None,
                   seed: int | None = None) -> list[ChatRequest]:
    """``k`` requests per row (sample index 0..k-1), tagged with the row's problem_id; ``templates``
    override the default prompt per answer type. With a run ``seed``, request (row, i) carries the
    sampler seed ``teacher_seed(seed, problem_id, i)``; None sends no seed."""
    if k < 1:
        raise ValueError(f"teacher.k_samples must be >= 1, got {k}")
    return [
        ChatRequest.make(solve_messages(r["problem"], r["answer_type"], templates), params, sample_index=i, tag=r["problem_id"],
                         seed=None if seed is None else teacher_seed(seed, r["problem_id"], i))
        for r in rows
        for i in range(k)
    ]


def verify_samples(rows: list[dict], results: list[ChatResult], timeout_s: float, workers: int) -> list[dict]:
    """One record per sample: problem_id, sample_index, seed (the sampler seed sent, or None),
    status (verified | wrong | unparseable_prediction | failed | timeout | error), text,
    completion_tokens, chars, error, cached, system_fingerprint (as the response gave it)."""
    by_id = {r["problem_id"]: r for r in rows}
    items, ok_idx = [], []
    for n, res in enumerate(results):
        if res.status == "ok":
            r = by_id[res.request.tag]
            items.append(VerifyItem(f"{n}", r["answer"], r.get("solution"), res.text or "", r["answer_type"]))
            ok_idx.append(n)
    verdicts = {int(v["key"]): v["status"] for v in verify_stable(items, timeout_s=timeout_s, workers=workers)} if items else {}
    out = []
    for n, res in enumerate(results):
        out.append({
            "problem_id": res.request.tag,
            "sample_index": res.request.sample_index,
            "seed": res.request.seed,
            "status": verdicts.get(n, "failed") if res.status == "ok" else "failed",
            "text": res.text,
            "completion_tokens": res.completion_tokens,
            "chars": len(res.text or ""),
            "error": res.error,
            "cached": res.cached,
            "system_fingerprint": res.system_fingerprint,
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
