"""A near-dedup corpus of real text at 10M-problem scale, built in minutes, with an exact ground truth
(the corpus of the ``dedup-speed-10m`` claim; ``dedup-speed`` at 100k keeps ``dedup_bench.build_corpus``).

Why not ``dedup_bench.build_corpus``: it generates every problem with DeepMind ``mathematics_dataset``
(about 19 ms a problem on one core here: 53 h for 10M on 2 cores). This builder generates a fixed,
small pool with the same generator and expands it by seeded, recorded edits:

1. **bases**: every distinct real text of ``dedup_bench.build_corpus`` (MATH test, MMLU dev/val, ARC,
   the benchmark items: about 25k) plus ``base_generated`` ``mathematics_dataset`` questions drawn with
   the seed (``dedup_bench.generated_problems``, cached by seed: ~3 min on 2 cores for 20k);
2. **variants** (the distinct background): a base whose numbers carry enough of its shingles
   (``min_digit_share`` of its Crucible shingles hold a digit) is re-numbered: every maximal digit run
   is replaced by a uniform random run of the same length (no leading zero), as the generator's
   templates would draw other numbers. Two variants of one base whose numbers all differ share only
   the digit-free shingles, so their Jaccard is at most (1 - s) / (1 + s) < 0.8 for digit share
   s >= 0.12 (0.54 at the default 0.3); a variant equal to an earlier text after ``normalize`` is
   drawn again (at most ``MAX_REDRAW`` times, then skipped and another base drawn);
3. **planted near-duplicates** (``plant_frac`` of ``n``): ``dedup_bench.perturb`` (0-3 word edits plus
   case/whitespace, the 100k corpus's recipe) of a background text drawn uniformly with replacement
   (a real, generated or variant text);
4. shuffled with the seed; every row records ``kind`` (0 real, 1 generated, 2 variant, 3 planted),
   ``family`` (the base it came from) and ``origin`` (for a planted row, the row it copies).

The ground truth is computed, not assumed: every pair with exact shingle Jaccard >= 0.8 by the
prefix-filtering join (``dedup_bench.prefix_join`` over Crucible's shingle hashes), so accidental
near-duplicates (between variants, or among the real texts) count like planted ones.

Both are input preparation, not timed, and cached on disk keyed by (n, seed, plant_frac, the source of
this builder, ``perturb`` and the generator): ``<cache>/dedup_corpus/``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

THRESHOLD = 0.8
MAX_REDRAW = 4
_DIGITS = re.compile(r"\d+")


def renumber(text: str, rng: random.Random) -> str:
    """``text`` with every maximal run of ASCII/Unicode digits replaced by a uniform random run of the
    same length (first digit 1-9 for runs longer than one). Raises ValueError when ``text`` has no digit."""
    if not _DIGITS.search(text):
        raise ValueError(f"renumber: no digit in {text[:80]!r}")

    def draw(m: re.Match) -> str:
        k = len(m.group(0))
        if k == 1:
            return str(rng.randrange(10))
        return str(rng.randrange(1, 10)) + "".join(str(rng.randrange(10)) for _ in range(k - 1))

    return _DIGITS.sub(draw, text)


def digit_share(texts: list[str]) -> np.ndarray:
    """Share (0-1) of each text's Crucible shingles (``ops.curation.text.shingles``) that hold a digit;
    0 for a text without shingles. Shape (len(texts),)."""
    from ops.curation.text import shingles

    out = np.zeros(len(texts))
    for i, t in enumerate(texts):
        s = shingles(t)
        if s:
            out[i] = sum(1 for x in s if any(c.isdigit() for c in x)) / len(s)
    return out


def _code_key() -> str:
    import dedup_bench as db

    h = hashlib.md5(Path(__file__).read_bytes())
    h.update(inspect.getsource(db.perturb).encode())
    h.update(inspect.getsource(db.build_corpus).encode())
    h.update(inspect.getsource(db.distinct_real_texts).encode())
    h.update((ROOT / "ops/curation/mathgen.py").read_bytes())
    return h.hexdigest()[:10]


def _bases(seed: int, base_generated: int, workdir: Path) -> tuple[list[str], np.ndarray, dict]:
    """Distinct real texts (as ``dedup_bench.build_corpus`` reads them) then distinct generated questions;
    kind per base (0 real, 1 generated); info."""
    import math

    import dedup_bench as db

    from ops.curation import mathgen
    from ops.curation.text import normalize

    texts, seen, counts = db.distinct_real_texts()
    kinds: list[int] = [0] * len(texts)
    if base_generated > 0:
        per_module = max(1, math.ceil(base_generated * 1.06 / (3 * len(mathgen.module_names()))))
        questions, gen_info = db.generated_problems(per_module, seed, workdir)
    else:
        questions, gen_info = [], {"per_module": 0}
    gen = []
    for q in questions:
        k = normalize(q)
        if k and k not in seen:
            seen.add(k)
            gen.append(q)
    gen = random.Random(seed).sample(gen, min(base_generated, len(gen)))
    texts += gen
    kinds += [1] * len(gen)
    return texts, np.array(kinds, dtype=np.int8), {"real_sources": counts, "generated_source": gen_info,
                                                   "real_distinct": kinds.count(0), "generated": len(gen)}


def build(n: int, seed: int, plant_frac: float, workdir: Path, base_generated: int = 20_000,
          min_digit_share: float = 0.3) -> tuple[list[str], dict[str, np.ndarray], dict]:
    """Build the corpus (module docstring). Returns (texts, columns, info): ``columns`` holds ``kind``
    (int8: 0 real, 1 generated, 2 variant, 3 planted), ``family`` (int64 base index) and ``origin``
    (int64 row a planted text copies, else -1), each shape (n,), in the shuffled order of ``texts``.
    Raises ValueError when ``n`` is smaller than the bases plus the planted rows, or no base qualifies
    for re-numbering."""
    import dedup_bench as db

    from ops.curation.text import normalize

    t0 = time.perf_counter()
    bases, base_kind, info = _bases(seed, base_generated, workdir)
    n_plant = int(round(plant_frac * n))
    n_var = n - n_plant - len(bases)
    if n_var < 0:
        raise ValueError(f"dedup corpus: n={n} is smaller than {len(bases)} bases + {n_plant} planted rows")
    share = digit_share(bases)
    elig = np.flatnonzero(share >= min_digit_share)
    if n_var and not len(elig):
        raise ValueError(f"dedup corpus: no base has digit share >= {min_digit_share}")
    rng = random.Random(seed * 7919 + 17)
    seen = {normalize(t) for t in bases}
    texts = list(bases)
    kind = list(base_kind.tolist())
    family = list(range(len(bases)))
    redrawn = skipped = 0
    elig_list = elig.tolist()
    t1 = time.perf_counter()
    while len(texts) < len(bases) + n_var:
        b = elig_list[rng.randrange(len(elig_list))]
        for attempt in range(MAX_REDRAW + 1):
            v = renumber(bases[b], rng)
            k = normalize(v)
            if k not in seen:
                seen.add(k)
                texts.append(v)
                kind.append(2)
                family.append(b)
                break
            redrawn += 1
        else:
            skipped += 1
    del seen
    t2 = time.perf_counter()
    n_bg = len(texts)
    origin = [-1] * n_bg
    ops_count: dict[str, int] = {}
    for _ in range(n_plant):
        s = rng.randrange(n_bg)
        e, ops = db.perturb(texts[s], rng)
        texts.append(e)
        kind.append(3)
        family.append(family[s])
        origin.append(s)
        for o in ops:
            ops_count[o] = ops_count.get(o, 0) + 1
    t3 = time.perf_counter()
    perm = np.random.default_rng(seed).permutation(len(texts))
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm))
    texts = [texts[i] for i in perm]
    kind_a = np.array(kind, dtype=np.int8)[perm]
    family_a = np.array(family, dtype=np.int64)[perm]
    origin_a = np.array(origin, dtype=np.int64)[perm]
    origin_a = np.where(origin_a >= 0, inv[np.maximum(origin_a, 0)], -1)
    info.update({
        "n": len(texts), "seed": seed, "plant_frac": plant_frac, "bases": len(bases),
        "bases_renumberable": int(len(elig)), "min_digit_share": min_digit_share,
        "variants": n_var, "variant_redraws": redrawn, "variant_bases_skipped": skipped, "planted": n_plant,
        "planted_op_counts": ops_count,
        "recipe": "bases = distinct real texts + mathematics_dataset questions; variants = bases re-numbered "
                  "(every digit run redrawn, same length), exact repeats redrawn; planted = dedup_bench.perturb "
                  "of a uniformly drawn background row; shuffled with np.random.default_rng(seed)",
        "seconds": {"bases": round(t1 - t0, 1), "variants": round(t2 - t1, 1), "planted": round(t3 - t2, 1),
                    "total": round(time.perf_counter() - t0, 1)},
    })
    return texts, {"kind": kind_a, "family": family_a, "origin": origin_a}, info


def ground_truth(texts: list[str], t: float = THRESHOLD) -> tuple[np.ndarray, np.ndarray, dict]:
    """Every pair (i < j) with exact shingle Jaccard >= ``t`` over Crucible's shingle hashes (prefix join,
    ``dedup_bench.prefix_join``). Returns (pairs shape (p, 2) int64, jaccard shape (p,), stats)."""
    import dedup_bench as db

    from ops.curation import minhash

    t0 = time.perf_counter()
    batch = minhash.shingle_batch(texts)
    ss = db.ShingleSets(batch.values, batch.offsets)
    del batch
    t1 = time.perf_counter()
    pairs, jac, stats = db.prefix_join(ss, t)
    stats.update(shingle_entries=int(len(ss.tok)), sets_seconds=round(t1 - t0, 1),
                 total_seconds=round(time.perf_counter() - t0, 1))
    return pairs, jac, stats


def cached(n: int, seed: int, plant_frac: float, cache: Path, **kw) -> tuple[Path, Path, dict]:
    """The corpus as JSON lines (``{"id", "text"}`` per row, the claims worker's format) and its ground
    truth (``.npz``: pairs, jaccard, kind, family, origin), built once per key under
    ``cache/dedup_corpus/``. Returns (corpus path, truth path, info)."""
    from ops.lake import atomic_path

    cache = Path(cache).resolve()
    key = f"n{n}_s{seed}_p{plant_frac}_{_code_key()}"
    if kw:
        key += "_" + hashlib.md5(json.dumps(kw, sort_keys=True).encode()).hexdigest()[:6]
    d = cache / "dedup_corpus"
    d.mkdir(parents=True, exist_ok=True)
    corpus, truth, meta = d / f"{key}.jsonl", d / f"{key}.truth.npz", d / f"{key}.json"
    if corpus.exists() and truth.exists() and meta.exists():
        info = json.loads(meta.read_text())
        info["cached"] = True
        return corpus, truth, info
    texts, cols, info = build(n, seed, plant_frac, cache, **kw)
    with atomic_path(corpus) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for i, t in enumerate(texts):
                f.write(json.dumps({"id": str(i), "text": t}) + "\n")
    pairs, jac, stats = ground_truth(texts)
    info["ground_truth"] = stats
    kinds = cols["kind"]
    fam = cols["family"]
    info["ground_truth"]["pairs_by_kind"] = {
        "with_a_planted_row": int(((kinds[pairs[:, 0]] == 3) | (kinds[pairs[:, 1]] == 3)).sum()) if len(pairs) else 0,
        "across_families": int((fam[pairs[:, 0]] != fam[pairs[:, 1]]).sum()) if len(pairs) else 0,
    }
    with atomic_path(truth) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, pairs=pairs, jaccard=jac, **cols)
    with atomic_path(meta) as tmp:
        Path(tmp).write_text(json.dumps(info, indent=1, default=str))
    info["cached"] = False
    return corpus, truth, info
