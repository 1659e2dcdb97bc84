"""Tables of claims rendered from ``benchmarks/results/claims.json`` into markdown pages.

A page marks where a table goes::

    <!-- claims:table ids=dedup-speed,curation-scale -->
    (anything here is replaced)
    <!-- /claims:table -->

``ids=`` lists claim ids in the order of the rows (left out: every claim in claims.json).
``cols=`` lists the columns to show, in the table's order, from ``claim, metric, estimate, verdict,
seeds, label, machine`` (left out: all of them); e.g. the README shows
``<!-- claims:table cols=claim,estimate,verdict,seeds,label -->`` and leaves metric and machine to
docs/claims.md's full table.
``python -m benchmarks.claims render`` fills every block of README.md and docs/*.md;
``render --check`` changes nothing and fails when a block differs from what the JSON renders, so a
figure quoted in a page is the figure in the JSON (tests/test_claims_render.py runs the check).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Optional

OPEN = re.compile(r"^<!-- claims:table(?:\s+ids=(?P<ids>[a-z0-9,\-]*))?(?:\s+cols=(?P<cols>[a-z,]*))?\s*-->\s*$")
CLOSE = "<!-- /claims:table -->"
COLUMNS = {"claim": "Claim", "metric": "Metric", "estimate": "Estimate [95% CI]", "verdict": "Verdict",
           "seeds": "Seeds run / planned", "label": "Label", "machine": "Machine"}
HEADER = ("| Claim | Metric | Estimate [95% CI] | Verdict | Seeds run / planned | Label | Machine |\n"
          "|---|---|---|---|---|---|---|")


class RenderError(ValueError):
    """A page whose markers cannot be rendered: the message names the file and line."""


def _num(x: float, decimals: int, signed: bool) -> str:
    return f"{x:+.{decimals}f}" if signed else f"{x:.{decimals}f}"


def format_estimate(claim: dict) -> str:
    """The estimate and its interval as a table cell: ``3.21x [2.90, 3.55]`` for a speed ratio,
    ``+2.50 [-1.10, +6.30] pts`` for a difference; the claim's status when it has no estimate."""
    if claim.get("status") == "not registered":
        return "designed, not registered"
    if claim.get("estimate") is None:
        if claim.get("seeds", {}).get("run", 0) == 0:
            return "registered, not yet run"
        return "no estimate (fewer than 2 usable seeds)"
    m = claim["metric"]
    d = int(m.get("decimals", 2))
    lo, hi = claim["ci95"]
    if claim["kind"] == "speed_ratio":
        cell = f"{_num(claim['estimate'], d, False)}x [{_num(lo, d, False)}, {_num(hi, d, False)}]"
        # the other baselines the rule names (``against``): each its own ratio, so the cell never shows
        # one peer's ratio as if it were the claim against all of them
        versus = claim.get("metrics", {}).get(m["name"], {}).get("versus", {})
        others = [(arm, v) for arm, v in versus.items() if v.get("estimate") is not None and v.get("ci95")]
        if others:
            arms = claim.get("arms", [])
            cell = f"vs {arms[1]} {cell}" if len(arms) > 1 else cell
            for arm, v in others:
                vlo, vhi = v["ci95"]
                cell += (f"; vs {arm} {_num(v['estimate'], d, False)}x "
                         f"[{_num(vlo, d, False)}, {_num(vhi, d, False)}]")
        return cell
    return f"{_num(claim['estimate'], d, True)} [{_num(lo, d, True)}, {_num(hi, d, True)}] {short_unit(m['unit'])}"


def short_unit(unit: str) -> str:
    """The unit of an estimate cell: a difference of two percentages (a unit that starts with ``%``, e.g.
    "% of 256 held-out problems passed") is in percentage points, ``pts``; any other unit as the design
    writes it up to its first space (the metric column carries the full description)."""
    unit = unit.strip()
    if unit.startswith("%"):
        return "pts"
    return unit if len(unit) <= 12 else unit.split()[0]


def cells(claim: dict) -> dict[str, str]:
    """The cells of one claims.json entry, keyed by column name (``COLUMNS``)."""
    seeds = claim.get("seeds", {})
    run, planned = seeds.get("run", 0), seeds.get("planned", 0)
    if claim.get("status") == "not registered":
        verdict = "not registered"
    elif run == 0:
        verdict = "registered, not yet run"
    else:
        verdict = claim["verdict"]
    if seeds.get("failed"):
        # attempts that raised before a result (logged with their errors, never dropped); a seed is
        # counted in "run" only once it has an ok record
        n = seeds["failed"]
        verdict += f" ({n} failed attempt{'s' if n != 1 else ''} logged)"
    machines = "; ".join(f"{m['cpu_model']}, {m['cores']} cores" for m in claim.get("machine", [])) or "-"
    m = claim["metric"]
    metric = f"{m['name']} ({m['unit']}, {m['direction']} better)"
    return {"claim": f"`{claim['id']}`", "metric": metric, "estimate": format_estimate(claim),
            "verdict": verdict, "seeds": f"{run} / {planned}", "label": claim["label"], "machine": machines}


def row(claim: dict, cols: Optional[Iterable[str]] = None) -> str:
    """One table row of a claims.json entry (``cols``: the columns to show; None: all)."""
    c = cells(claim)
    return "| " + " | ".join(c[k] for k in (COLUMNS if cols is None else cols)) + " |"


def table(claims: dict, ids: Optional[Iterable[str]], where: str = "",
          cols: Optional[Iterable[str]] = None) -> str:
    """The markdown table of ``ids`` (None: every claim) with columns ``cols`` (None: all).

    Raises:
        RenderError: an unknown claim id or column name (the message names ``where``).
    """
    chosen = list(claims) if ids is None else list(ids)
    unknown = [i for i in chosen if i not in claims]
    if unknown:
        raise RenderError(f"{where}: unknown claim ids {unknown} (claims.json has {sorted(claims)})")
    if cols is None:
        header = HEADER
    else:
        cols = list(cols)
        bad = [k for k in cols if k not in COLUMNS]
        if bad or not cols:
            raise RenderError(f"{where}: unknown columns {bad} in cols= (choose from {', '.join(COLUMNS)})")
        header = "| " + " | ".join(COLUMNS[k] for k in cols) + " |\n|" + "---|" * len(cols)
    return "\n".join([header] + [row(claims[i], cols) for i in chosen])


def render_text(text: str, claims: dict, where: str = "<text>") -> str:
    """``text`` with every marked block filled from ``claims`` (claims.json's ``claims``).

    Raises:
        RenderError: an opening marker without its closing marker, a closing marker without an
            opening one, or an unknown claim id (the message names ``where`` and the line).
    """
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = OPEN.match(line.strip())
        if line.strip() == CLOSE:
            raise RenderError(f"{where}:{i + 1}: '{CLOSE}' without an opening '<!-- claims:table -->'")
        if not m:
            out.append(line)
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip() != CLOSE:
            if OPEN.match(lines[j].strip()):
                raise RenderError(f"{where}:{j + 1}: a claims:table block opens inside the one at line {i + 1}")
            j += 1
        if j == len(lines):
            raise RenderError(f"{where}:{i + 1}: '{line.strip()}' has no closing '{CLOSE}'")
        ids = [s for s in m.group("ids").split(",") if s] if m.group("ids") else None
        cols = [s for s in m.group("cols").split(",") if s] if m.group("cols") is not None else None
        out += [line, table(claims, ids, f"{where}:{i + 1}", cols), lines[j]]
        i = j + 1
    return "\n".join(out)


def pages(root: Path) -> list[Path]:
    """The pages that may quote claims: README.md and docs/*.md."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.exists()]


def render_pages(root: Path, claims: dict, check: bool = False,
                 paths: Optional[list[Path]] = None) -> list[Path]:
    """Fill (or with ``check``, only compare) the blocks of every page; returns the pages whose blocks
    differ from the JSON (with ``check``) or that were rewritten."""
    changed = []
    for p in paths if paths is not None else pages(root):
        text = p.read_text()
        new = render_text(text, claims, str(p.relative_to(root) if p.is_relative_to(root) else p))
        if new != text:
            changed.append(p)
            if not check:
                p.write_text(new)
    return changed
