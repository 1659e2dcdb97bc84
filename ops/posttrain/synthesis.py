"""Targeted synthesis around failure regions: retrieve related material, make new items, and keep only
the ones that are new, clean and verified (Logics-STEM, arXiv 2601.01562 §3).

* Retrieval: TF-IDF nearest neighbours (scikit-learn ``TfidfVectorizer`` + cosine
  ``NearestNeighbors``) over the curated corpus (problems with their solutions): for each region,
  the documents closest to its failed items. They are reported per region and are the context of
  teacher synthesis.
* Generator synthesis (primary on the embedded default): where a ``mathematics_dataset`` module
  covers the region, new items come from the generator with a fresh seed, at the region's level.
* Teacher synthesis (optional): the teacher resource writes one new question with its answer from
  retrieved documents and a failed example; the item is kept only when an independent teacher
  solution verifies against that answer (two agreeing samples).
* Every item passes ``ItemFilter``: exact dedup (MD5 of the normalised text) and near dedup (MinHash,
  word 5-grams, Jaccard >= 0.8; ``ops.curation.minhash``) against the corpus and each other,
  decontamination against the benchmarks and the evaluation items (``ops.curation.decontam``), and
  verification of its response against its answer (``ops.curation.verify``). Rejections are counted
  by reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ops.curation.dedup import NearDedupParams

REASONS = ("duplicate_exact", "duplicate_near", "contaminated", "unverifiable")


@dataclass
class SynthesisParams:
    """Parameters of targeted synthesis, the ``targeted_synthesis`` run config (module docstring
    for the method).

    Raises:
        ValueError: a field outside its range (the message names it and the range).
    """

    pool_per_module: int = 150
    """Generator items per (module, level) in the synthesis pool (>= 1; targeted and random draw from it)."""
    pool_seed: int = 303
    """The generator's seed for the pool (a fresh one: not stage 1's)."""
    budget: int = 600
    """New items per arm (>= 0; targeted and the random control get the same number)."""
    retrieval_k: int = 3
    """Documents retrieved per region and per teacher request (>= 1)."""
    near_threshold: float = NearDedupParams.threshold
    """MinHash Jaccard threshold of near duplicates, in (0, 1) (LSH; 0.8, as in curation's near-dedup:
    docs/curation.md)."""
    num_perm: int = NearDedupParams.num_perm
    """MinHash permutations (num_perm), in [16, 8192]."""
    verify_timeout_s: float = 5.0
    """The verifier's wall clock per item (s, > 0)."""
    workers: int = 2
    """Verifier processes (>= 1)."""
    teacher_requests: int = 0
    """Teacher synthesis requests (>= 0; each also costs one solve request). Off by default on the
    embedded profile: SmolLM2-135M rarely writes a question whose answer it can then verify, and
    each request takes seconds on 2 cores; set it with a production teacher endpoint."""
    teacher_max_tokens: int = 96
    """Completion tokens per teacher request (>= 1)."""
    seed: int = 0
    """Seed of the targeted and random draws and of the teacher requests."""

    def __post_init__(self):
        from ops.curation import minhash

        minhash.check_threshold(self.near_threshold, "targeted_synthesis.near_threshold", allow_exact=False)
        minhash.check_num_perm(self.num_perm, "targeted_synthesis.num_perm")
        for name, lo in (("pool_per_module", 1), ("budget", 0), ("retrieval_k", 1), ("workers", 1),
                         ("teacher_requests", 0), ("teacher_max_tokens", 1)):
            if getattr(self, name) < lo:
                raise ValueError(f"targeted_synthesis.{name} must be >= {lo}, got {getattr(self, name)}")
        if not self.verify_timeout_s > 0:
            raise ValueError(f"targeted_synthesis.verify_timeout_s must be > 0, got {self.verify_timeout_s}")


_D = SynthesisParams


class Retriever:
    """TF-IDF nearest-neighbour retrieval over documents (scikit-learn).

    Args:
        docs: document texts (>= 1).
    Raises:
        ValueError: no documents.
    """

    def __init__(self, docs: list[str]):
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.neighbors import NearestNeighbors

        if not docs:
            raise ValueError("Retriever: no documents to index")
        self.docs = docs
        self.vec = TfidfVectorizer(token_pattern=r"(?u)\b\w\w+\b", ngram_range=(1, 2), min_df=1, sublinear_tf=True,
                                   max_features=200_000)
        self.X = self.vec.fit_transform(docs)
        self.nn = NearestNeighbors(metric="cosine").fit(self.X)

    def query(self, texts: list[str], k: int = 3) -> list[list[tuple[int, float]]]:
        """For each text, the ``k`` closest documents as (index, cosine similarity), best first."""
        if not texts:
            return []
        k = min(k, len(self.docs))
        dist, idx = self.nn.kneighbors(self.vec.transform(texts), n_neighbors=k)
        return [[(int(i), float(1 - d)) for i, d in zip(ri, rd)] for ri, rd in zip(idx, dist)]


@dataclass
class FilterReport:
    """Counts of one filter pass: ``seen``, ``kept`` and rejections by reason (``REASONS``)."""

    seen: int = 0
    """Items the filter was given."""
    kept: int = 0
    """Items that passed every stage."""
    rejected: dict = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    """Rejected items per reason (keys: ``REASONS``)."""

    def as_rows(self) -> list[dict]:
        return [{"stage": "seen", "items": self.seen}] + [{"stage": f"rejected: {r}", "items": n} for r, n in self.rejected.items()] \
            + [{"stage": "kept", "items": self.kept}]


class ItemFilter:
    """Dedup against a corpus, decontamination against benchmarks, verification — one stage with
    its counters (datatrove style).

    Args:
        corpus: problem texts the new items must not repeat (training corpus, stage-1 data).
        benchmarks: dicts with ``benchmark``, ``item_id``, ``problem`` (evaluation benchmarks, and the
            post-training evaluation items as their own benchmark).
        near_threshold, num_perm, verify_timeout_s, workers: as in :class:`SynthesisParams` (which
            checks their ranges; near_threshold 0.8, as in curation's near-dedup: docs/curation.md).
    """

    def __init__(self, corpus: list[str], benchmarks: list[dict], near_threshold: float = _D.near_threshold,
                 num_perm: int = _D.num_perm, verify_timeout_s: float = _D.verify_timeout_s, workers: int = _D.workers,
                 decontam_config=None):
        from ops.curation.decontam import DecontamConfig, Decontaminator, MiniLMEmbedder
        from ops.curation.text import text_hash

        self.corpus = [c for c in corpus if c]
        self.corpus_hashes = {text_hash(c) for c in self.corpus}
        cfg = decontam_config or DecontamConfig()
        self.embedder = MiniLMEmbedder(cfg.semantic_max_tokens)  # the shared benchmark-embedding cache, counters
        self.decontam = Decontaminator(benchmarks, cfg, embedder=self.embedder) if benchmarks else None
        self.semantic: dict = {"texts_embedded": 0, "benchmark_texts": 0, "encode_s": 0.0}
        self.near_threshold, self.num_perm = near_threshold, num_perm
        self.verify_timeout_s, self.workers = verify_timeout_s, workers

    def _near_duplicates(self, texts: list[str]) -> np.ndarray:
        """Bool (n,): the text is a near duplicate of a corpus text or of an earlier text."""
        from ops.curation import minhash

        n = len(texts)
        batch = minhash.shingle_batch(texts + self.corpus)
        bands, rows = minhash.lsh_params(self.near_threshold, self.num_perm)
        sig = minhash.signatures(batch, self.num_perm)
        cand = minhash.band_candidates(sig, bands, rows)
        cand = cand[cand[:, 0] < n]  # pairs (i < j) whose first member is a new item
        out = np.zeros(n, dtype=bool)
        if len(cand):
            sims = minhash.pair_jaccard(batch, cand)
            for (i, j), s in zip(cand.tolist(), sims.tolist()):
                if s >= self.near_threshold:
                    out[j if j < n else i] = True  # a later new item, or the new item against the corpus
        return out

    def run(self, items: list[dict]) -> tuple[list[dict], list[dict], FilterReport]:
        """Filter ``items`` (dicts with ``item_id``, ``problem``, ``answer``, ``response``,
        ``answer_type``). Returns (kept, rejected with a ``reason``, report); order is kept."""
        from ops.curation.text import text_hash
        from ops.curation.verify import VerifyItem, verify_stable

        rep = FilterReport(seen=len(items))
        reason: list[str | None] = [None] * len(items)
        seen = set(self.corpus_hashes)
        for i, it in enumerate(items):
            h = text_hash(it["problem"])
            if h in seen:
                reason[i] = "duplicate_exact"
            seen.add(h)
        live = [i for i in range(len(items)) if reason[i] is None]
        if live:
            near = self._near_duplicates([items[i]["problem"] for i in live])
            for i, dup in zip(live, near.tolist()):
                if dup:
                    reason[i] = "duplicate_near"
        live = [i for i in range(len(items)) if reason[i] is None]
        if live and self.decontam is not None:
            flags = self.decontam.run([items[i]["problem"] for i in live])
            sem = self.decontam.stats.get("semantic", {})
            for k in self.semantic:
                self.semantic[k] += sem.get(k, 0)
            for i, f in zip(live, flags):
                if f is not None:
                    reason[i] = "contaminated"
                    items[i] = {**items[i], "contaminated_with": f"{f['benchmark']}:{f['item_id']}:{f['layer']}"}
        # a boxed answer textually equal to the reference verifies without math-verify (as in
        # ops.posttrain.evaluate.score); the rest go through verify_stable (timeouts retried once)
        live = [i for i in range(len(items)) if reason[i] is None
                and not _boxed_equals(items[i]["response"], items[i].get("answer"))]
        if live:
            res = verify_stable([VerifyItem(str(i), str(items[i].get("answer") or ""), None, items[i]["response"],
                                            items[i].get("answer_type", "numeric")) for i in live],
                                self.verify_timeout_s, self.workers)
            for i, r in zip(live, res):
                if r["status"] != "verified":
                    reason[i] = "unverifiable"
        kept, rejected = [], []
        for it, r in zip(items, reason):
            if r is None:
                kept.append(it)
            else:
                rep.rejected[r] += 1
                rejected.append({**it, "reason": r})
        rep.kept = len(kept)
        return kept, rejected, rep


def _boxed_equals(response: str, answer) -> bool:
    """The response's last ``\\boxed{}`` is textually the (non-empty) reference answer."""
    from ops.curation.verify import last_boxed

    a = str(answer or "").strip()
    b = last_boxed(response or "")
    return bool(a) and b is not None and b.strip() == a


def allocate(targets: list[dict], budget: int) -> list[int]:
    """Split ``budget`` items over targets in proportion to their failure mass (largest remainder)."""
    if not targets or budget <= 0:
        return [0] * len(targets)
    w = np.asarray([max(t["failure_mass"], 1e-9) for t in targets], dtype=float)
    raw = budget * w / w.sum()
    out = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - out))[: budget - out.sum()]:
        out[i] += 1
    return out.tolist()


def select_targeted(pool: pl.DataFrame, targets: list[dict], budget: int, seed: int = _D.seed) -> pl.DataFrame:
    """Targeted items: for each target (module, difficulty) its allocated number of pool items
    (a seeded sample; a target with too few items gives what it has, the shortfall goes to the
    next targets in order). ``pool`` has ``module``, ``difficulty``."""
    want = allocate(targets, budget)
    parts, carry = [], 0
    for t, n in zip(targets, want):
        cell = pool.filter(pl.col("module") == t["module"])
        if t.get("difficulty") is not None:
            cell = cell.filter(pl.col("difficulty") == t["difficulty"])
        take = min(cell.height, n + carry)
        carry = n + carry - take
        if take:
            parts.append(cell.sample(take, seed=seed, shuffle=True).with_columns(target=pl.lit(f"{t['module']}|{t.get('difficulty')}")))
    if not parts:
        return pool.head(0).with_columns(target=pl.lit(None, pl.String))
    return pl.concat(parts)


def select_random(pool: pl.DataFrame, n: int, seed: int = _D.seed) -> pl.DataFrame:
    """The control: ``n`` items drawn uniformly from the same filtered pool (seeded)."""
    return pool.sample(min(n, pool.height), seed=seed + 1, shuffle=True)


# --- teacher synthesis ---------------------------------------------------------------------------

_Q = re.compile(r"Question:\s*(.+?)\s*(?:\n|$)Answer:\s*(.+)", re.S)


def synthesis_messages(examples: list[str], docs: list[str]) -> list[dict]:
    """Chat messages asking the teacher for one new question like ``examples``, informed by ``docs``."""
    ctx = "\n\n".join(f"[doc {i + 1}] {d[:600]}" for i, d in enumerate(docs))
    ex = "\n".join(f"- {e}" for e in examples)
    return [{"role": "system", "content": "You write new, self-contained math exercises with a single short final answer."},
            {"role": "user", "content": f"Reference material:\n{ctx}\n\nA student got these wrong:\n{ex}\n\n"
                                        "Write ONE new question of the same kind (different numbers), then its answer.\n"
                                        "Format exactly:\nQuestion: <question>\nAnswer: \\boxed{<answer>}"}]


def solve_messages(problem: str) -> list[dict]:
    """Chat messages asking the teacher to solve ``problem`` with a boxed final answer."""
    return [{"role": "user", "content": f"{problem}\nGive the final answer in \\boxed{{}}."}]


def parse_synthesis(text: str | None) -> tuple[str, str] | None:
    """(question, answer) from a teacher synthesis response, or None when the format is not met."""
    from ops.curation.verify import last_boxed

    m = _Q.search(text or "")
    if not m:
        return None
    q = m.group(1).strip()
    a = last_boxed(m.group(2)) or m.group(2).strip().splitlines()[0].strip()
    if len(q) < 8 or not a:
        return None
    return q, a


def teacher_synthesis(client, targets: list[dict], failed: pl.DataFrame, retriever: Retriever, docs: list[str],
                      n_requests: int, max_tokens: int = _D.teacher_max_tokens, retrieval_k: int = _D.retrieval_k,
                      seed: int = _D.seed, verify_timeout_s: float = _D.verify_timeout_s,
                      workers: int = _D.workers) -> tuple[list[dict], dict]:
    """LLM synthesis around the targets, kept only when two teacher samples agree.

    For request i (targets taken round-robin): the target module's failed problems (up to 3) and the
    ``retrieval_k`` documents nearest to them go into ``synthesis_messages``; a parsed (question,
    answer) is then solved independently (``solve_messages``, temperature 0) and kept only when that
    solution verifies against the proposed answer.

    Args:
        client: an ``ops.teacher.client.TeacherClient`` (``complete(list[ChatRequest])``).
        failed: failed evaluation items (``module``, ``problem``).
    Returns:
        (items with ``origin`` "teacher" in the row format of ``ops.posttrain.data.generated_rows``,
        stats ``{"requested", "parsed", "agreed"}``).
    """
    from ops.curation.verify import VerifyItem, verify_stable
    from ops.teacher.client import ChatRequest

    from .data import answer_type_of_module, boxed

    stats = {"requested": 0, "parsed": 0, "agreed": 0}
    if n_requests <= 0 or not targets:
        return [], stats
    reqs = []
    for i in range(n_requests):
        t = targets[i % len(targets)]
        ex = failed.filter(pl.col("module") == t["module"])["problem"].head(3).to_list() or [t["module"]]
        hits = retriever.query([" ".join(ex)], k=retrieval_k)[0]
        reqs.append(ChatRequest.make(synthesis_messages(ex, [docs[j] for j, _ in hits]),
                                     {"temperature": 0.8, "max_tokens": max_tokens}, seed=seed + i,
                                     tag=f"{t['module']}|{t['difficulty']}|{i}"))
    results = client.complete(reqs)
    stats["requested"] = len(reqs)
    proposed = []
    for res in results:
        q = parse_synthesis(res.text) if res.status == "ok" else None
        if q:
            proposed.append((res.request.tag, *q))
    stats["parsed"] = len(proposed)
    if not proposed:
        return [], stats
    solves = client.complete([ChatRequest.make(solve_messages(q), {"temperature": 0.0, "max_tokens": max_tokens}, tag=tag)
                              for tag, q, _ in proposed])
    checks = verify_stable([VerifyItem(str(i), a, None, s.text if s.status == "ok" else "", "numeric")
                            for i, ((_, _, a), s) in enumerate(zip(proposed, solves))], timeout_s=verify_timeout_s, workers=workers)
    items = []
    for (tag, q, a), c in zip(proposed, checks):
        if c["status"] != "verified":
            continue
        module, diff, i = tag.split("|")
        items.append({"item_id": f"teacher-{i}", "problem": q, "answer": a, "response": boxed(a),
                      "answer_type": answer_type_of_module(module, a), "module": module, "level": None,
                      "difficulty": int(diff) if diff not in ("None", "") else None, "domain": "math", "origin": "teacher"})
    stats["agreed"] = len(items)
    return items, stats


@dataclass
class TargetedArms:
    """The result of :func:`targeted_arms`: both arms and what the asset reports about them."""

    both: pl.DataFrame
    """The targeted arm and the random control (column ``arm``; ``target`` = cell, ``teacher`` or null)."""
    targeted: pl.DataFrame
    random: pl.DataFrame
    rejected: pl.DataFrame
    """Every rejected item (generator pool and teacher) with its ``reason``."""
    report: FilterReport
    """The generator pool's filter funnel."""
    teacher_report: FilterReport | None
    teacher_stats: dict
    """requested / parsed / agreed (and dropped_eval_template) of teacher synthesis."""
    teacher_kept: int
    retrieved: list[dict]
    """Per target, the retrieved documents: target, similarity, document (first 160 characters)."""
    inputs: int
    """Pool items plus teacher items considered."""
    eval_templates: int
    pool_templates: int
    embedding: dict
    """The filter's semantic decontamination: texts embedded, benchmark texts among them, encode seconds, texts
    actually run through the encoder (``encoded``; cache misses), of which benchmark texts (``encoded_benchmark``),
    and the shared benchmark-embedding cache files read and written."""


def targeted_arms(params: SynthesisParams, targets: list[dict], items: pl.DataFrame, train: pl.DataFrame, ev: pl.DataFrame,
                  curated: pl.DataFrame | None, bench: pl.DataFrame | None, teacher=None) -> TargetedArms:
    """Targeted synthesis end to end (module docstring): retrieval over the curated corpus (problem +
    solution; else the stage-1 training rows), the synthesis-side generator pool of the evaluation's
    modules, teacher items from ``teacher(failed, retriever, docs) -> (items, stats)`` when given
    (those in an evaluation template dropped), the filter (corpus = stage-1 training problems +
    curated problems; benchmarks = ``bench`` + the evaluation items), and the two arms of
    ``params.budget`` items.

    Args:
        targets: failure_regions' targets (module, difficulty, failure_mass, regions).
        items: failure_regions' scored items (module, problem, failure_mass).
        train, ev: sft_checkpoint's training and evaluation tables.
        curated, bench: decontaminated_problems and benchmark_problems, or None when absent.

    Raises:
        RuntimeError: an evaluation template is also a synthesis-pool template (a broken
            ``ops.posttrain.data.template_side`` split).
    """
    from ops.posttrain.data import template_of
    from ops.posttrain.sets import pool_rows

    modules = sorted(set(ev.filter(pl.col("module").is_not_null())["module"].to_list()))
    corpus = train["problem"].to_list() + (curated["problem"].to_list() if curated is not None else [])
    benchmarks = ([{"benchmark": b, "item_id": i, "problem": p} for b, i, p in bench.select("benchmark", "item_id", "problem").iter_rows()]
                  if bench is not None else [])
    benchmarks += [{"benchmark": "posttrain_eval", "item_id": i, "problem": p} for i, p in ev.select("item_id", "problem").iter_rows()]
    flt = ItemFilter(corpus, benchmarks, near_threshold=params.near_threshold, num_perm=params.num_perm,
                     verify_timeout_s=params.verify_timeout_s, workers=params.workers)
    if curated is not None and curated.height:
        docs = [f"{p}\n{s or ''}".strip() for p, s in curated.select("problem", "solution").iter_rows()]
    else:
        docs = [f"{p}\n{r}" for p, r in train.select("problem", "response").iter_rows()]
    retr = Retriever(docs)
    failed = items.filter(pl.col("failure_mass") > 0)
    retrieved = []
    for t in targets:
        q = failed.filter(pl.col("module") == t["module"])["problem"].head(5).to_list()
        if q:
            for j, sim in retr.query([" ".join(q)], k=params.retrieval_k)[0]:
                retrieved.append({"target": f"{t['module']}|{t['difficulty']}", "similarity": round(sim, 3), "document": docs[j][:160]})

    pool = pool_rows(modules, params.pool_per_module, params.pool_seed)  # synthesis-side templates only
    key = pl.concat_str("module", "template", separator="\x1f")
    eval_templates = set(ev.filter(pl.col("template").is_not_null()).select(key).to_series().to_list())
    pool_templates = set(pool.select(key).to_series().to_list())
    if eval_templates & pool_templates:  # template_side makes this impossible; a broken split must not go unseen
        raise RuntimeError(f"targeted_synthesis: {len(eval_templates & pool_templates)} (module, template) pairs are both "
                           "evaluation and synthesis templates")
    kept, rejected, rep = flt.run(pool.to_dicts())
    kept_df = pl.DataFrame(kept, schema=pool.schema) if kept else pool.head(0)
    t_items, t_stats = teacher(failed, retr, docs) if teacher is not None else ([], {"requested": 0, "parsed": 0, "agreed": 0})
    if t_items:  # a teacher question in an evaluation template is dropped (the held-out rule covers every source)
        n0 = len(t_items)
        t_items = [it for it in t_items if f"{it['module']}\x1f{template_of(it['problem'])}" not in eval_templates]
        t_stats["dropped_eval_template"] = n0 - len(t_items)
    t_kept, t_rej, t_rep = flt.run(t_items) if t_items else ([], [], None)
    targeted = select_targeted(kept_df, targets, max(0, params.budget - len(t_kept)), seed=params.seed)
    if t_kept:
        targeted = pl.concat([targeted, pl.DataFrame(t_kept).with_columns(target=pl.lit("teacher"))], how="diagonal_relaxed")
    random = select_random(kept_df, targeted.height, seed=params.seed).with_columns(target=pl.lit(None, pl.String))
    both = pl.concat([targeted.with_columns(arm=pl.lit("targeted")), random.with_columns(arm=pl.lit("random"))],
                     how="diagonal_relaxed")
    rej = pl.DataFrame(rejected + t_rej) if (rejected or t_rej) else pl.DataFrame({"reason": []}, schema={"reason": pl.String})
    return TargetedArms(both, targeted, random, rej, rep, t_rep, t_stats, len(t_kept), retrieved, pool.height + len(t_items),
                        len(eval_templates), len(pool_templates),
                        {**{k: round(v, 2) for k, v in flt.semantic.items()}, "encoded": flt.embedder.encoded,
                         "encoded_benchmark": flt.embedder.encoded_benchmark,
                         "benchmark_cache_files": flt.embedder.benchmark_cache_paths})
