"""Figures once (issue 38 item 5, issue 41 item 5): README.md is a tour of at most 1,200 words whose only
figures are the claims table rendered from benchmarks/results/claims.json — no speed-ups, percentages,
points, wall times, throughputs, dates or machine names in its prose. Version pins, command arguments,
arXiv ids and ports are not figures and are not flagged."""

import re
from pathlib import Path

import pytest

from benchmarks.claims.render import CLOSE, OPEN

ROOT = Path(__file__).resolve().parents[1]
MAX_WORDS = 1200

_NUM = r"(?<![\w.])[+-]?\d(?:[\d,]*\d)?(?:\.\d+)?"  # a number that does not start inside a word or version
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
FIGURES = {
    "speed ratio": re.compile(_NUM + r"\s?(?:x|×)(?!\w|\.\w)"),                   # 13.2x, 3 ×
    "x faster": re.compile(r"\b(?:x|×|times)\s+(?:faster|slower|quicker)", re.I),  # "x faster"
    "speed-up": re.compile(r"\bspeed-?ups?\s+(?:of\s+)?" + _NUM.replace("(?<![\\w.])", "")),
    "percentage": re.compile(_NUM + r"\s?(?:%|per\s?cent\b)", re.I),
    "points": re.compile(_NUM + r"\s?(?:points|pts|pp)\b"),
    "duration": re.compile(_NUM + r"\s?(?:s|ms|µs|us|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?)\b"
                           r"(?![-/]\w)"),
    "throughput": re.compile(_NUM + r"\s?[A-Za-z]*/(?:s|sec|second|min|h)\b"),
    "date": re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b(?:19|20)\d\d/[01]\d/[0-3]\d\b"
                       r"|\b" + _MONTH + r"\s+\d{1,2},?\s+(?:19|20)\d\d\b"
                       r"|\b\d{1,2}\s+" + _MONTH + r"\s+(?:19|20)\d\d\b"
                       r"|\b(?:in|on|since|as of|until)\s+(?:19|20)\d\d\b(?![.\d])"),
    "machine": re.compile(r"\b(?:EPYC|Xeon|Ryzen|Threadripper|Core i[3579]|H100|H200|A100|V100"
                          r"|Apple M\d)\b|\b\d+-core\b", re.I),
}


def outside_rendered_tables(text: str) -> str:
    """``text`` without its ``<!-- claims:table ... -->`` blocks (markers included)."""
    out, inside = [], False
    for line in text.split("\n"):
        if OPEN.match(line.strip()):
            inside = True
        elif line.strip() == CLOSE:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def figures(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, matched text) for each figure in ``text`` outside the rendered tables; the
    line numbers count the whole text."""
    found, inside = [], False
    for n, line in enumerate(text.split("\n"), 1):
        if OPEN.match(line.strip()):
            inside = True
            continue
        if line.strip() == CLOSE:
            inside = False
            continue
        if inside:
            continue
        for kind, pat in FIGURES.items():
            found += [(n, kind, m.group(0)) for m in pat.finditer(line)]
    return found


@pytest.mark.parametrize("text,kind", [
    ("Dedup is 13.2x the fastest peer.", "speed ratio"),
    ("throughput 3.04x over async", "speed ratio"),
    ("RollArc runs 2 × the baseline", "speed ratio"),
    ("it is many times faster than datasketch", "x faster"),
    ("a speedup of 1.47 at 8 workers", "speed-up"),
    ("78% of held-out prompts", "percentage"),
    ("recall 95.9 % at t = 0.8", "percentage"),
    ("GRPO gain +18.2 points", "points"),
    ("+2.0 pts [-3.6, +7.5]", "points"),
    ("main job 1,042 s in a fresh clone", "duration"),
    ("takes roughly 30 to 60 minutes", "duration"),
    ("the warm start alone about 14 min", "duration"),
    ("0.237s warm", "duration"),
    ("about 40 tokens/s at batch 4", "throughput"),
    ("measured on 2026-12-06", "date"),
    ("measured on Dec 6, 2026", "date"),
    ("measured on 6 December 2026", "date"),
    ("as of 2026 the default", "date"),
    ("on a 2-core AMD EPYC", "machine"),
    ("on an NVIDIA H100", "machine"),
])
def test_a_figure_in_prose_is_flagged(text, kind):
    assert kind in {k for _, k, _ in figures(text)}, figures(text)


@pytest.mark.parametrize("text", [
    "pip install torch==2.13.0 'fsspec>=2026.9.0,<2027' dagster 1.13.x",
    ".venv/bin/crucible demo --limit 5 --target-size 2000 --per-module 20",
    "make test -n 3; dagster dev -h 127.0.0.1 -p 3000",
    "Logics-STEM, arXiv 2601.01562 §2; D-CPT Law (arXiv 2406.01375)",
    "Dagster's k8s executor, s3:// roots, SmolLM2-135M-Instruct, Python 3.11",
    "cpt_probe_runs[size x ratio], a 256x16 table, hex 0x1f",
    "the 3 seeds and 5 sources; docs/mixture.md; section 4.3",
])
def test_pins_arguments_and_ids_are_not_figures(text):
    assert figures(text) == []


def test_figures_inside_the_rendered_table_are_not_flagged_and_outside_are():
    page = ("Intro.\n<!-- claims:table cols=claim,estimate -->\n| `dedup-speed` | 6.20x [5.9, 6.5] |\n"
            "| `g` | +2.0 [-3.6, +7.5] pts |\n<!-- /claims:table -->\nAfter: 6.2x.\n")
    assert figures(page) == [(6, "speed ratio", "6.2x")]
    assert "6.20x" not in outside_rendered_tables(page) and "Intro." in outside_rendered_tables(page)


def test_readme_is_a_tour_of_at_most_1200_words():
    words = len((ROOT / "README.md").read_text().split())  # what `wc -w` counts
    assert words <= MAX_WORDS, f"README.md has {words} words (at most {MAX_WORDS}): move detail to docs/"


def test_the_mixture_page_stays_under_5000_words():
    """Issue 41 item 5: docs/mixture.md under 5,000 words (the page was 13,192 before the history of its
    figures moved to docs/changelog.md)."""
    words = len((ROOT / "docs" / "mixture.md").read_text().split())
    assert words < 5000, f"docs/mixture.md has {words} words (under 5,000): move history to docs/changelog.md"


def test_readme_states_no_figure_outside_the_rendered_claims_table():
    text = (ROOT / "README.md").read_text()
    assert any(OPEN.match(ln.strip()) for ln in text.split("\n")), "README.md lost its claims table"
    found = figures(text)
    assert found == [], "README.md states figures outside the claims table (render them from claims.json " \
                        "or move them to a docs page): " + "; ".join(f"line {n}: {k} '{m}'" for n, k, m in found)
