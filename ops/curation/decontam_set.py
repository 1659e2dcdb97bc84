"""A labelled decontamination set built from benchmark items, and per-layer precision and recall on it.

The field's failure modes (docs/curation.md, "Decontamination"), each as a kind of row, built from
MATH-500 items (Lightman et al. 2023, the 500-problem subset of the MATH test set):

* positives (contaminated): ``light_edit`` (a word dropped, a prefix such as "Solve:" added),
  ``escaped`` (JSON-escaped backslashes, Markdown-escaped punctuation, ``\\dfrac``/``\\left(``
  spellings), ``sibling`` (the same question with other numbers; the hand-written
  "last nonzero digit ... 141/400" included), ``rephrased`` (clauses reordered and synonyms: ten
  rephrasings written by hand, :data:`HAND_REPHRASED`, and rule-based ones, :func:`rephrase`);
* negatives (clean): ``unrelated`` — different problems that share a common phrase with a MATH-500
  item: ten written by hand (:data:`HAND_UNRELATED`) and real problems from a pool (MATH test
  problems outside MATH-500, GSM8K test) that share an opening phrase or a 4-gram with a MATH-500
  item but hold under a quarter of its 8-grams.

Labels are by construction. Known noise: the MATH test set holds a few rephrasings of MATH-500
problems (e.g. the point reflected across ``x = 1`` then ``y = 2``), which the pool negatives
label clean; such a row counts against the layer that catches it.
"""

from __future__ import annotations

import random
import re
from collections import Counter

import numpy as np

from .text import match_normalize, match_tokens

# hand-written rephrasings of MATH-500 items (clauses reordered, synonyms), keyed by item id
HAND_REPHRASED = {
    "math500/300": "What is the largest possible number of intersection points, counting every point where two or more "
                   "of them meet, for four different circles drawn in the same plane?",
    "math500/140": "Find the largest value that $\\gcd(n + 7, 2n + 1)$ can take, where $n$ is any positive integer.",
    "math500/357": "A deck of $54$ cards is dealt out completely to $x$ players so that every player receives $y$ cards. "
                   "Given that $x \\ge 2$ and $y \\ge 5$, how many values can $x$ take?",
    "math500/67": "A rectangle is made from a square by shrinking two opposite sides by $40\\%$ and stretching the other "
                  "two sides by $50\\%$. What is the percentage decrease in area compared with the square?",
    "math500/86": "How many different outfits made of one hat, one shirt and one pair of pants are possible if you own "
                  "8 hats, 5 shirts and 6 pairs of pants?",
    "math500/330": "In how many ways can a 5-member subcommittee be chosen from a Senate committee of 6 Democrats and "
                   "8 Republicans so that both parties are represented on it?",
    "math500/55": "What is the degree of the polynomial $f$ satisfying \\[(x-1)\\cdot f(x)=3x^4+x^3 - 25x^2 +38x -17?\\]",
    "math500/465": "List in increasing order all positive integers that have exactly three positive divisors. Which "
                   "number is in fifth place?",
    "math500/37": "By at least how many degrees must a regular pentagon be turned counterclockwise around its center "
                  "before it lands on its starting position again?",
    "math500/401": "Find the largest value of \\[|1 + z| + |1 - z + z^2|\\] over all complex numbers $z$ with $|z| = 1.$",
}

# a template sibling from the issue: MATH-500's "... of 137/500" with other numbers
HAND_SIBLINGS = {
    "math500/438": "What is the last nonzero digit to the right of the decimal point in the decimal expansion of "
                   "$\\frac{141}{400}$?",
}

# different problems that share a common phrase with a MATH-500 item (the item named as "near")
HAND_UNRELATED = [
    ("math500/140", "Let $n$ be a positive integer. Prove that $n^3 - n$ is always divisible by $6$."),
    ("math500/401", "Find the maximum value of $\\sin x + \\cos x$ over all real numbers $x$."),
    ("math500/465", "When the positive integers are listed in ascending order, what is the sum of the first hundred of them?"),
    ("math500/78", "Solve the system $a + b = 7$ and $a - b = 1$. Enter the ordered pair $(a,b).$"),
    ("math500/330", "A Senate committee has 100 members. If each member shakes hands with every other member exactly "
                    "once, how many handshakes take place?"),
    ("math500/55", "Suppose that $f$ is a linear function with $f(2) = 5$ and $f(4) = 9$. What is $f(10)$?"),
    ("math500/401", "Let $z$ be a complex number such that $z^2 = -4.$ Find all possible values of $z.$"),
    ("math500/37", "A regular hexagon has side length $4$. What is its area? Express your answer in simplest radical form."),
    ("math500/86", "You have 3 red marbles and 4 blue marbles in a bag. What is the probability of drawing two red "
                   "marbles without replacement? Express your answer as a common fraction."),
    ("math500/300", "Four distinct points are chosen on a circle. How many triangles have all three vertices among them?"),
]

POSITIVE_KINDS = ("light_edit", "escaped", "sibling", "rephrased")
NEGATIVE_KINDS = ("unrelated",)

_SYNONYMS = [  # (pattern, replacement), applied outside $...$ math, first letter case kept
    (r"\bwhat is the value of\b", "determine"), (r"\bhow many\b", "what is the number of"), (r"\bfind\b", "determine"),
    (r"\bcompute\b", "calculate"), (r"\bevaluate\b", "work out"), (r"\bsimplify\b", "reduce"),
    (r"\bwhat is\b", "determine"), (r"\bsuppose\b", "assume"), (r"\blargest\b", "greatest"),
    (r"\bsmallest\b", "least"), (r"\bpositive integers\b", "positive whole numbers"),
    (r"\bpositive integer\b", "positive whole number"), (r"\bnumber of\b", "count of"), (r"\bsum of\b", "total of"),
    (r"\bproduct of\b", "result of multiplying"), (r"\bpossible\b", "attainable"), (r"\bexpress\b", "write"),
    (r"\bcommon fraction\b", "fraction in lowest terms"), (r"\bdistinct\b", "different"), (r"\bequal to\b", "the same as"),
    (r"\btotal\b", "overall"), (r"\bminimum\b", "least"), (r"\bmaximum\b", "greatest"), (r"\bsatisfies\b", "fulfils"),
    (r"\bthere are\b", "we have"), (r"\beach\b", "every"), (r"\bif\b", "when"), (r"\bgiven\b", "provided"),
]
_MATH = re.compile(r"(\$[^$]*\$|\\\[.*?\\\]|\\\(.*?\\\))", re.S)
_SENT = re.compile(r"(?<=[.?!])\s+(?=[A-Z])")


def _outside_math(text: str, fn) -> str:
    parts = _MATH.split(text)
    return "".join(p if k % 2 else fn(p) for k, p in enumerate(parts))


def _synonyms(text: str) -> str:
    def sub(seg: str) -> str:
        for pat, rep in _SYNONYMS:
            seg = re.sub(pat, lambda m: rep[0].upper() + rep[1:] if m.group(0)[0].isupper() else rep, seg, flags=re.I)
        return seg

    return _outside_math(text, sub)


def rephrase(text: str) -> str:
    """A rule-based rephrasing: synonyms outside math, then clause order changed — the question sentence
    first, the setting after "Here," — or, for one sentence "If A, B?", "B if A?"."""
    t = _synonyms(text.strip())
    sents = _SENT.split(t)
    if len(sents) >= 2:
        return sents[-1] + " Here, " + sents[0][0].lower() + sents[0][1:] + (" " + " ".join(sents[1:-1]) if len(sents) > 2 else "")
    m = re.match(r"^(When|If|Provided|Given)\b(.+?),\s*(.+?)([?.])$", t, flags=re.S)
    if m:
        q = m.group(3)
        return q[0].upper() + q[1:] + " " + m.group(1).lower() + m.group(2) + m.group(4)
    return t


# extra synonyms for word problems (GSM8K) and exam stems (MMLU), used by rephrase_deep on top of _SYNONYMS
_DEEP_SYNONYMS = [
    (r"\bhow much\b", "what amount"), (r"\bbuys\b", "purchases"), (r"\bbought\b", "purchased"),
    (r"\bsells\b", "sells off"), (r"\bcosts\b", "is priced at"), (r"\bper day\b", "a day"),
    (r"\bevery day\b", "daily"), (r"\bper week\b", "a week"), (r"\bper hour\b", "an hour"),
    (r"\bdollars\b", "bucks"), (r"\bhalf\b", "one half"), (r"\btwice\b", "two times"),
    (r"\bwants to\b", "would like to"), (r"\bdecides to\b", "chooses to"), (r"\bstarts\b", "begins"),
    (r"\bgets\b", "receives"), (r"\bgives\b", "hands"), (r"\bmakes\b", "earns"), (r"\bneeds\b", "requires"),
    (r"\bwhich of the following\b", "which option"), (r"\bmost likely\b", "most probably"),
    (r"\bbecause\b", "since"), (r"\bincreases?\b", "rises"), (r"\bdecreases?\b", "falls"),
    (r"\bimportant\b", "significant"), (r"\bcalled\b", "known as"), (r"\busually\b", "typically"),
    (r"\bshows\b", "indicates"), (r"\bcorrect\b", "right"), (r"\bpeople\b", "persons"),
]
# first names of word problems, each mapped to another (rephrase_deep)
_NAMES = dict(zip(
    "Janet James John Tom Mary Mark Sarah Jim Tim Bob Alice Ann Anna Jane Joe Sam Ben Dan Jack Kate Lisa Mike Paul "
    "Peter Susan Carla Carlos Maria Jose Emily Josh Eric Jason Kim Greg Brian Terry Tony Amy Sally Steve Betty "
    "Henry Jill Jenna Jerry Jordan Kelly Lily Linda Rose".split(),
    "Priya Omar Keiko Lars Ines Tariq Yuki Bruno Ravi Olga Nadia Felix Hana Oscar Mina Pablo Dara Ivan Zoe Elif "
    "Noor Kofi Aiko Rafael Sven Ayla Dmitri Leila Tomas Farah Ilan Rohan Nia Mateo Saba Kenji Amara Luca Selin "
    "Emeka Anya Hugo Mei Idris Lena Jonas Marta Kai Sofia Rania".split()))


def rephrase_deep(text: str, rng: random.Random) -> str:
    """A harder rule-based rephrasing than :func:`rephrase`, for word problems and exam stems: first names changed
    (:data:`_NAMES`), the synonyms of :func:`rephrase` plus word-problem ones, then the question sentence first
    (the setting after "Here,"), or the sentences of the setting shuffled. Trailing option lines of a
    multiple-choice item stay as they are. Numbers are kept: the answer is the item's.

    A stand-in for LLM rephrasings: it changes wording and order but never restructures a sentence, so an
    embedding finds it more easily than a rephrasing written by a model."""
    body = text.rstrip()
    m = re.search(r"(?:\n[ \t]*\(?[A-J][.)][^\n]*)+$", body)
    options = body[m.start():] if m else ""
    body = body[: m.start()] if m else body
    body = re.sub(r"\b(" + "|".join(_NAMES) + r")\b", lambda k: _NAMES[k.group(1)], body)

    def sub(seg: str) -> str:
        for pat, rep in _DEEP_SYNONYMS:
            seg = re.sub(pat, lambda k: rep[0].upper() + rep[1:] if k.group(0)[0].isupper() else rep, seg, flags=re.I)
        return seg

    body = _outside_math(_synonyms(body.strip()), sub)
    sents = _SENT.split(body)
    if len(sents) >= 3 and rng.random() < 0.5:
        head = sents[:-1]
        rng.shuffle(head)
        body = " ".join(head + sents[-1:])
    elif len(sents) >= 2:
        first = sents[0]
        if first.split(" ", 1)[0] in ("A", "An", "The", "There", "In", "If", "On", "At", "For", "When", "After"):
            first = first[0].lower() + first[1:]
        body = sents[-1] + " Here, " + first + (" " + " ".join(sents[1:-1]) if len(sents) > 2 else "")
    return body + options


def light_edit(text: str, rng: random.Random) -> str:
    """One word dropped (outside math) and a prompt prefix added: what a scraped copy looks like."""
    parts = _MATH.split(text)
    prose = [k for k, p in enumerate(parts) if k % 2 == 0 and len(p.split()) >= 3]
    if prose:
        k = rng.choice(prose)
        words = parts[k].split(" ")
        idx = [i for i, w in enumerate(words) if w.isalpha()]
        if idx:
            del words[rng.choice(idx)]
        parts[k] = " ".join(words)
    return rng.choice(["Solve: ", "Problem: ", "Question: ", ""]) + "".join(parts)


def escape(text: str, rng: random.Random) -> str:
    """A stored-differently copy: JSON-escaped backslashes, or Markdown-escaped punctuation with ``\\dfrac`` and
    ``\\left( \\right)`` spellings."""
    if "\\" in text and rng.random() < 0.6:
        return text.replace("\\", "\\\\")
    t = re.sub(r"\\[dt]?frac(?![A-Za-z])", r"\\dfrac", text)
    t = re.sub(r"(?<![\\A-Za-z])\(", r"\\left(", t)
    t = re.sub(r"(?<![\\A-Za-z])\)", r"\\right)", t)
    return re.sub(r"([*_#])", r"\\\1", t)


def sibling(text: str, rng: random.Random) -> str | None:
    """The same question with other numbers (each integer outside ``[asy]`` code shifted), None without numbers."""
    if "[asy]" in text or not re.search(r"\d", text):
        return None

    def new(m):
        v = int(m.group(0))
        return str(v + rng.choice([1, 2, 3, 5, 7]) if v < 10 else v + rng.randint(1, max(2, v // 3)))

    return re.sub(r"(?<![\w.^_])\d+(?![\w.])", new, text) if re.search(r"(?<![\w.^_])\d+(?![\w.])", text) else None


def _grams(text: str, n: int) -> set:
    toks = match_tokens(text)
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def labelled_set(benchmark: list[dict], pool: list[str] | None = None, per_kind: int = 60, seed: int = 0) -> list[dict]:
    """The labelled set: dicts with ``problem``, ``label`` (True = contaminated), ``kind`` and ``item_id``
    (the MATH-500 item it was built from, or the nearest one for ``unrelated``).

    Args:
        benchmark: benchmark items (dicts with ``benchmark``, ``item_id``, ``problem``); MATH-500's are used.
        pool: candidate negative texts (MATH test problems, GSM8K test items ...); MATH-500 problems in it are
            skipped. None: only the hand-written negatives.
        per_kind: generated rows per kind (the hand-written rows come on top).
        seed: the seed of every choice.
    Raises:
        ValueError: the benchmark holds no MATH-500 item.
    """
    rng = random.Random(seed)
    items = [b for b in benchmark if b.get("benchmark") == "math500"]
    if not items:
        raise ValueError("labelled_set: the benchmark has no math500 item")
    by_id = {b["item_id"]: b for b in items}
    rows: list[dict] = []

    def add(problem, label, kind, item_id):
        rows.append({"problem": problem, "label": label, "kind": kind, "item_id": item_id})

    long_items = [b for b in items if len(match_tokens(b["problem"])) >= 12]
    for b in rng.sample(long_items, min(per_kind, len(long_items))):
        add(light_edit(b["problem"], rng), True, "light_edit", b["item_id"])
    for b in rng.sample(items, min(per_kind, len(items))):
        add(escape(b["problem"], rng), True, "escaped", b["item_id"])
    sib = [(b, sibling(b["problem"], rng)) for b in long_items]
    sib = [(b, s) for b, s in sib if s and match_normalize(s) != match_normalize(b["problem"])]
    for b, s in rng.sample(sib, min(per_kind, len(sib))):
        add(s, True, "sibling", b["item_id"])
    for iid, s in HAND_SIBLINGS.items():
        if iid in by_id:
            add(s, True, "sibling", iid)
    for iid, s in HAND_REPHRASED.items():
        if iid in by_id:
            add(s, True, "rephrased", iid)
    short_prose = [b for b in long_items if "[asy]" not in b["problem"] and len(b["problem"]) < 600]
    for b in rng.sample(short_prose, min(per_kind, len(short_prose))):
        add(rephrase(b["problem"]), True, "rephrased", b["item_id"])
    for iid, s in HAND_UNRELATED:
        add(s, False, "unrelated", iid)
    if pool:
        m500 = {match_normalize(b["problem"]) for b in items}
        grams8 = [_grams(b["problem"], 8) for b in items]
        opening: dict[tuple, int] = {}
        four: dict[tuple, list[int]] = {}
        for k, b in enumerate(items):
            toks = match_tokens(b["problem"])
            opening.setdefault(tuple(toks[:3]), k)
            for g in {tuple(toks[i : i + 4]) for i in range(len(toks) - 3)}:
                four.setdefault(g, []).append(k)
        common = {g for g, ks in four.items() if sum(t.isalpha() for t in g) >= 3}
        cands = []
        for text in pool:
            if not text or match_normalize(text) in m500:
                continue
            toks = match_tokens(text)
            near = opening.get(tuple(toks[:3]))
            if near is None:
                shared = Counter(k for g in {tuple(toks[i : i + 4]) for i in range(len(toks) - 3)} if g in common
                                 for k in four[g])
                near = shared.most_common(1)[0][0] if shared else None
            if near is None:
                continue
            tg = _grams(text, 8)
            if any(g and len(g & tg) >= 0.25 * len(g) for g in grams8):
                continue
            cands.append((text, items[near]["item_id"]))
        for text, iid in rng.sample(cands, min(2 * per_kind, len(cands))):
            add(text, False, "unrelated", iid)
    return rows


def evaluate(rows: list[dict], flags: list[dict | None]) -> dict:
    """Precision and recall on a labelled set, overall, per layer and per kind.

    Per layer L (the layer that decided each removal): ``flagged`` rows, ``precision`` = contaminated
    rows among them / flagged, ``recall`` = contaminated rows L removed / all contaminated rows (the
    layers' recalls add up to the overall recall). Per kind: rows and the fraction removed (recall for
    a positive kind, false-positive rate for ``unrelated``). A removal counts as correct only when it
    names the row's own item, for a positive row.
    """
    from .decontam import LAYERS

    label = np.array([r["label"] for r in rows], dtype=bool)
    removed = np.array([f is not None for f in flags], dtype=bool)
    right_item = np.array([f is not None and f["item_id"] == r["item_id"] for r, f in zip(rows, flags)], dtype=bool)
    tp = removed & label
    out = {
        "rows": len(rows), "contaminated": int(label.sum()), "clean": int((~label).sum()),
        "precision": float(tp.sum() / max(removed.sum(), 1)), "recall": float(tp.sum() / max(label.sum(), 1)),
        "matched_own_item": float((tp & right_item).sum() / max(tp.sum(), 1)),
        "false_positives": int((removed & ~label).sum()), "false_negatives": int((~removed & label).sum()),
        "layers": {}, "kinds": {},
    }
    layer_of = [f["layer"] if f else None for f in flags]
    for layer in LAYERS:
        sel = np.array([lay == layer for lay in layer_of], dtype=bool)
        if sel.any():
            out["layers"][layer] = {"flagged": int(sel.sum()), "precision": float((sel & label).sum() / sel.sum()),
                                    "recall": float((sel & label).sum() / max(label.sum(), 1))}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        sel = np.array([r["kind"] == kind for r in rows], dtype=bool)
        caught = Counter(lay for lay, s in zip(layer_of, sel) if s and lay)
        out["kinds"][kind] = {"rows": int(sel.sum()), "removed_fraction": float(removed[sel].mean()),
                              "by_layer": dict(sorted(caught.items()))}
    return out
