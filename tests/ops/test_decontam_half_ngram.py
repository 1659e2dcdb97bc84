"""Layer ``half-ngram`` of the strict policy (docs/curation.md, "Decontamination"): no row may hold
half or more of a MATH-500 item's word 8-grams, even when every shared 8-gram is uninformative and
the other layers pass it, here the Asymptote grid-drawing code of a figure that 60 items share
(the case the main job met: 2 rows at 0.502 of math500/360, whose text is mostly that code)."""

import random

from ops.curation.decontam import HALF_NGRAM_N, DecontamConfig, Decontaminator, _TOKEN, half_ngram_overlaps
from ops.curation.text import match_normalize

GRID = '[asy]\nunitsize(0.4 cm);\n\npair A, B, L, R;\nint i, n;\n\nfor (i = -8; i <= 8; ++i) {\n  draw((i,-8)--(i,8),gray(0.7));\n  draw((-8,i)--(8,i),gray(0.7));\n}\n\ndraw((-8,0)--(8,0),Arrows(6));\ndraw((0,-8)--(0,8),Arrows(6));\n\nA = (-5,4);\nB = (-1,3);\nL = extension(A, B, (-8,0), (-8,1));\nR = extension(A, B, (8,0), (8,1));\n\ndraw(L--R, red);\n\nlabel("$x$", (8,0), E);\nlabel("$y$", (0,8), N);\n[/asy]'
VOCAB = ["alpha", "beta", "gamma", "delta", "line", "point", "axis", "slope", "value", "sum", "product", "figure",
         "curve", "circle", "radius", "angle", "side", "length", "area", "ratio", "square", "cube", "root", "term"]


def _items():
    g = len(_TOKEN.findall(match_normalize(GRID)))
    qs = []
    for k in range(60):                       # a question a little shorter than the figure code
        rng = random.Random(k)
        qs.append(f"Problem {k}: " + " ".join(rng.choice(VOCAB) for _ in range(int(0.9 * g))))
    return [{"benchmark": "math500", "item_id": f"math500/{k}", "problem": q + "\n\n" + GRID} for k, q in enumerate(qs)]


def test_strict_removes_a_row_holding_half_of_an_items_8grams_that_other_layers_pass():
    items = _items()
    row = "Which quadrant contains the vertex of the parabola drawn in the figure?\n\n" + GRID
    clean = "Find the remainder when 3^50 is divided by 11."
    [(_, bi, frac)] = half_ngram_overlaps([row], items, n=HALF_NGRAM_N)
    assert 0.5 <= frac < 0.55                                    # just over the line, like the main job's rows
    strict = Decontaminator(items, DecontamConfig(policy="strict"), embedder=None).run([row, clean])
    assert strict[0]["layer"] == "half-ngram" and strict[0]["item_id"] == items[bi]["item_id"]
    assert abs(strict[0]["score"] - frac) < 1e-9 and strict[1] is None
    # today's layers (policy ngram) keep it: only the guarantee's own count sees it
    assert Decontaminator(items, DecontamConfig(policy="ngram"), embedder=None).run([row, clean]) == [None, None]
