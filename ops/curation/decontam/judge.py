"""Layer 7 of decontamination (:mod:`ops.curation.decontam`): an LLM judge (the teacher resource) asked, for
every pair in the borderline band of embedding cosines, whether the two problems are the same problem. Fail-closed:
no reply, an unparseable reply, a time-out or a pair past the budget removes the row for review
(case ``llm-judge-fail-closed``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

JUDGE_SYSTEM = "You compare two exam problems. Reply with one word: Yes or No."
JUDGE_PROMPT = ("Problem A:\n{a}\n\nProblem B:\n{b}\n\nAre A and B the same problem, possibly reworded, reordered or "
                "with different numbers? Answer Yes or No.")


def judge_messages(problem: str, benchmark_item: str) -> list[dict]:
    """Chat messages asking the judge whether ``problem`` is ``benchmark_item`` in other words."""
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": JUDGE_PROMPT.format(a=problem[:2000], b=benchmark_item[:2000])}]


def teacher_judge(session: Callable) -> Judge:
    """A :data:`Judge` on an OpenAI-compatible teacher: one greedy request per pair, 4 tokens, sent
    together in one ``session()`` (a context manager yielding an ``ops.teacher.client`` client); a
    failed request is None (the detector then fails closed)."""
    from ops.teacher.client import ChatRequest

    def judge(pairs: list[tuple[str, str]]) -> list[str | None]:
        reqs = [ChatRequest.make(judge_messages(a, b), {"temperature": 0.0, "max_tokens": 4}, tag=str(k))
                for k, (a, b) in enumerate(pairs)]
        with session() as client:
            results = client.complete(reqs)
        by_tag = {r.request.tag: (r.text if r.status == "ok" else None) for r in results}
        return [by_tag.get(str(k)) for k in range(len(pairs))]

    return judge


def parse_judge_reply(text: str | None) -> bool | None:
    """True for a reply whose first word is yes, False for no, None for anything else (garbage, empty,
    an error): the caller treats None as contaminated (fail-closed)."""
    words = re.findall(r"[a-z]+", (text or "").lower())
    return {"yes": True, "no": False}.get(words[0]) if words else None


#: a judge takes (problem, benchmark item) pairs and returns one raw reply per pair (None: it failed)
Judge = Callable[[list[tuple[str, str]]], list["str | None"]]


def _call_judge(judge: Judge, pairs: list[tuple[str, str]], timeout_s: float) -> tuple[list[str | None], str | None]:
    """Run the judge with a wall-clock limit. Returns (replies, error); on error or time-out every reply is None."""
    box: dict = {}

    def target():
        try:
            box["replies"] = list(judge(pairs))
        except Exception as e:  # noqa: BLE001 - any judge failure fails closed
            box["error"] = f"{type(e).__name__}: {e}"[:300]

    t = threading.Thread(target=target, name="decontam-judge", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return [None] * len(pairs), f"judge timed out after {timeout_s:.0f}s"
    if "error" in box:
        return [None] * len(pairs), box["error"]
    replies = box.get("replies", [])
    if len(replies) != len(pairs):
        return [None] * len(pairs), f"judge returned {len(replies)} replies for {len(pairs)} pairs"
    return replies, None


class JudgeLayer:
    """Layer 7 of :class:`ops.curation.decontam.Decontaminator` (a mixin: it reads the detector's ``cfg``, ``items``
    and ``judge``)."""

    def judge_borderline(self, entries: list[tuple[float, int, str, int]]) -> tuple[list[tuple], dict]:
        """Layer 7 (``judge`` on), over the borderline pairs of the whole corpus at once: ``entries`` are
        (cosine, row key, row problem, item index), best first (cosine, then row key, then item, all descending);
        the first ``judge_max_pairs`` go to the judge in one call (``judge_timeout_s``), the rest fail closed.

        Returns:
            (verdicts, counts): (row key, item index, layer, cosine, needs_review, judge_reply) for every row the
            layer removes (``llm-judge`` on yes, ``llm-judge-fail-closed`` otherwise; a clear no keeps the row),
            and the judge's counts (asked, yes, no, unparseable, failed, over_budget, error).
        """
        cfg = self.cfg
        asked, over = entries[: cfg.judge_max_pairs], entries[cfg.judge_max_pairs :]
        js = {"asked": len(asked), "yes": 0, "no": 0, "unparseable": 0, "failed": 0, "over_budget": len(over), "error": None}
        replies, error = ([None] * len(asked), "no judge configured") if self.judge is None else \
            _call_judge(self.judge, [(p, self.items[b]["problem"]) for _, _, p, b in asked], cfg.judge_timeout_s)
        js["error"] = error
        verdicts = []
        for (cos, key, _, b), reply in zip(asked, replies):
            verdict = parse_judge_reply(reply)
            if verdict is True:
                js["yes"] += 1
                verdicts.append((key, b, "llm-judge", cos, False, reply))
            elif verdict is False:
                js["no"] += 1
            else:
                js["failed" if reply is None else "unparseable"] += 1
                verdicts.append((key, b, "llm-judge-fail-closed", cos, True,
                                 reply if reply is not None else f"<no reply: {error or 'failed'}>"))
        for cos, key, _, b in over:
            verdicts.append((key, b, "llm-judge-fail-closed", cos, True, "<not judged: judge_max_pairs reached>"))
        return verdicts, js
