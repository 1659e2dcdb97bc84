"""Figures once (issue 38, item 5): the claims tables of README.md and docs/*.md equal what
benchmarks/results/claims.json renders; the renderer's blocks, statuses and errors."""

import json
from pathlib import Path

import pytest

from benchmarks.claims.render import RenderError, format_estimate, pages, render_pages, render_text

ROOT = Path(__file__).resolve().parents[1]


def test_every_page_table_equals_claims_json():
    """`python -m benchmarks.claims render --check` on README.md and every docs/*.md."""
    claims = json.loads((ROOT / "benchmarks" / "results" / "claims.json").read_text())["claims"]
    assert (ROOT / "README.md") in pages(ROOT)
    differ = render_pages(ROOT, claims, check=True)
    assert differ == [], f"tables differ from claims.json in {differ}: run python -m benchmarks.claims render"


def claim(cid, **kw):
    c = {"id": cid, "status": "complete", "label": "real", "kind": "speed_ratio",
         "metric": {"name": "wall_s", "unit": "s", "direction": "lower", "decimals": 2},
         "seeds": {"run": 5, "planned": 5, "failed": 0}, "estimate": 3.214, "ci95": [2.901, 3.55],
         "verdict": "shown", "machine": [{"cpu_model": "AMD EPYC 7B13", "cores": 2}]}
    c.update(kw)
    return c


CLAIMS = {
    "dedup-speed": claim("dedup-speed"),
    "rp-acc": claim("rp-acc", kind="non_inferiority", estimate=-0.5, ci95=[-1.25, 0.25], verdict="shown",
                    metric={"name": "pass_rate", "unit": "pts", "direction": "higher", "decimals": 1}),
    "gba-auc": claim("gba-auc", status="registered, not yet run", estimate=None, ci95=None, verdict="incomplete",
                     seeds={"run": 0, "planned": 10, "failed": 0}, machine=[]),
    "new": claim("new", status="not registered", estimate=None, ci95=None, verdict=None, machine=[],
                 seeds={"run": 0, "planned": 5, "failed": 0}),
}

PAGE = """# A page

Text before.

<!-- claims:table ids=dedup-speed,rp-acc,gba-auc,new -->
| stale | table |
<!-- /claims:table -->

Text after.
"""


def test_render_fills_a_block_with_one_row_per_id_in_order():
    out = render_text(PAGE, CLAIMS, "page.md")
    lines = out.split("\n")
    start = lines.index("<!-- claims:table ids=dedup-speed,rp-acc,gba-auc,new -->")
    rows = lines[start + 3:start + 7]
    assert rows[0] == ("| `dedup-speed` | wall_s (s, lower better) | 3.21x [2.90, 3.55] | shown | 5 / 5 | real | "
                       "AMD EPYC 7B13, 2 cores |")
    assert "| -0.5 [-1.2, +0.2] pts | shown |" in rows[1]  # round half to even, signed differences
    assert "| registered, not yet run | registered, not yet run | 0 / 10 |" in rows[2]
    assert "| designed, not registered | not registered | 0 / 5 |" in rows[3]
    assert "| stale | table |" not in out and out.endswith("Text after.\n")
    assert render_text(out, CLAIMS, "page.md") == out  # idempotent


def test_check_reports_a_page_whose_table_differs(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(render_text(PAGE, CLAIMS))
    assert render_pages(tmp_path, CLAIMS, check=True, paths=[page]) == []
    edited = page.read_text().replace("3.21x", "13.2x")  # a hand-edited figure
    page.write_text(edited)
    assert render_pages(tmp_path, CLAIMS, check=True, paths=[page]) == [page]
    assert page.read_text() == edited  # --check changes nothing
    assert render_pages(tmp_path, CLAIMS, paths=[page]) == [page]
    assert "3.21x" in page.read_text()


def test_a_block_without_ids_lists_every_claim():
    out = render_text("<!-- claims:table -->\n<!-- /claims:table -->", CLAIMS)
    assert [ln.split("|")[1].strip() for ln in out.split("\n")[3:-1]] == [f"`{c}`" for c in CLAIMS]


def test_cols_picks_columns_in_order_and_ids_still_restrict():
    out = render_text("<!-- claims:table ids=rp-acc,dedup-speed cols=claim,estimate,verdict,seeds,label -->\n"
                      "old\n<!-- /claims:table -->", CLAIMS, "page.md")
    assert out.split("\n")[1:-1] == [
        "| Claim | Estimate [95% CI] | Verdict | Seeds run / planned | Label |",
        "|---|---|---|---|---|",
        "| `rp-acc` | -0.5 [-1.2, +0.2] pts | shown | 5 / 5 | real |",
        "| `dedup-speed` | 3.21x [2.90, 3.55] | shown | 5 / 5 | real |",
    ]
    assert "EPYC" not in out and "wall_s" not in out  # machine and metric left out
    every = render_text("<!-- claims:table cols=verdict,claim -->\n<!-- /claims:table -->", CLAIMS)
    assert every.split("\n")[3] == "| shown | `dedup-speed` |" and every.count("\n| ") == len(CLAIMS) + 1


@pytest.mark.parametrize("text,msg", [
    ("a\n<!-- claims:table ids=dedup-speed -->\nrow\n", r"page.md:2: .* has no closing"),
    ("a\n<!-- /claims:table -->\n", r"page.md:2: .* without an opening"),
    ("<!-- claims:table ids=nope -->\n<!-- /claims:table -->", r"page.md:1: unknown claim ids \['nope'\]"),
    ("<!-- claims:table cols=claim,cpu -->\n<!-- /claims:table -->", r"page.md:1: unknown columns \['cpu'\]"),
])
def test_bad_markers_name_the_file_and_line(text, msg):
    with pytest.raises(RenderError, match=msg):
        render_text(text, CLAIMS, "page.md")


@pytest.mark.parametrize("unit,short", [
    ("% rise of the general validation loss over the validated base model", "pts"),
    ("pass rate", "pass rate"), ("AUC", "AUC"), ("s", "s"),
    ("1 when the regime check says ok for the seed, else 0", "1")])
def test_estimate_cells_name_a_short_unit_and_leave_the_description_to_the_metric_column(unit, short):
    from benchmarks.claims.render import short_unit

    assert short_unit(unit) == short
    c = claim("d", kind="paired_difference", estimate=-8.951, ci95=[-9.06, -8.85],
              metric={"name": "m", "unit": unit, "direction": "higher", "decimals": 2})
    assert format_estimate(c) == f"-8.95 [-9.06, -8.85] {short}"
