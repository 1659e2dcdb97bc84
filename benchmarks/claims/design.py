"""A claim's design file (``benchmarks/claims/designs/<claim_id>.yaml``): loading and validation.

The keys (docs/claims.md, "The design file"): ``id``, ``paper``, ``statement``, ``label`` (real |
simulated), ``arms`` (first = treatment, second = baseline), ``metric`` (one mapping or a list; each
``name``, ``unit``, ``direction``: higher | lower, optional ``margin`` and ``decimals``), ``kind``,
``unit``, ``seeds`` (fresh: >= 1000), ``test``, ``decision_rule`` (``margin``, ``rule``), ``order``,
``warmup``, ``command`` (``module:function``) with fixed kwargs under ``params`` (top level or inside a
``command`` mapping), ``budget_minutes``; optional ``runs_from``: another claim's id whose logged
runs this claim is decided on (the same command, params and arms; its seeds a subset of that claim's),
for two claims about one run (a speed-up and the accuracy beside it). A design that breaks one of them
raises ``DesignError`` naming the file and the field.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.claims.stats import KINDS

CLAIMS_DIR = Path(__file__).resolve().parent
DESIGNS = CLAIMS_DIR / "designs"
FRESH_SEED_MIN = 1000
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_COMMAND = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
REQUIRED = ("id", "paper", "statement", "label", "arms", "metric", "kind", "unit", "seeds", "test",
            "decision_rule", "order", "warmup", "command", "budget_minutes")


class DesignError(ValueError):
    """A design file that cannot be used: the message names the file and the field."""


@dataclass(frozen=True)
class Metric:
    """One metric of a claim. ``direction``: "higher" or "lower" is better. ``margin``: the decision
    margin (the design's ``decision_rule.margin`` unless the metric sets its own)."""

    name: str
    unit: str
    direction: str
    margin: float
    decimals: int = 2
    decide: bool = True
    """False: estimated and reported, not part of the verdict (e.g. the warm time beside the cold one)."""


@dataclass(frozen=True)
class Design:
    """A validated design. ``sha256`` is the hex digest of the file's bytes (what registration pins)."""

    id: str
    path: Path
    sha256: str
    paper: str
    statement: str
    label: str
    arms: tuple[str, ...]
    metrics: tuple[Metric, ...]
    kind: str
    unit: str
    seeds: tuple[int, ...]
    test: str
    margin: float
    rule: str
    order: str
    warmup: str
    command: str
    params: dict = field(default_factory=dict)
    budget_minutes: float = 0.0
    n_resamples: int = 10_000
    rng_seed: int = 0
    ratio_interval: str = "delta"
    against: tuple[str, ...] = ()
    """The arms the treatment must beat (``decision_rule.against``; default: the second arm)."""
    runs_from: str | None = None
    """Another claim whose log holds this claim's runs (``runs_from``): nothing runs under this id."""
    raw: dict = field(default_factory=dict)

    def arm_order(self, seed: int) -> list[str]:
        """The arms' order for ``seed``: the arms rotated by the seed's position in the registered
        list (two arms alternate: A,B then B,A ...). Raises DesignError for a seed not in the list."""
        if seed not in self.seeds:
            raise DesignError(f"{self.path}: seed {seed} is not in the registered seeds {list(self.seeds)}")
        k = self.seeds.index(seed) % len(self.arms)
        return list(self.arms[k:] + self.arms[:k])


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def design_path(claim_id: str, designs: Path = DESIGNS) -> Path:
    """The design file of ``claim_id``; raises DesignError when there is none."""
    p = Path(designs) / f"{claim_id}.yaml"
    if not p.exists():
        known = sorted(q.stem for q in Path(designs).glob("*.yaml"))
        raise DesignError(f"no design file {p} (designs: {', '.join(known) or 'none'})")
    return p


def _need(cond: bool, path: Path, key: str, msg: str) -> None:
    if not cond:
        raise DesignError(f"{path}: field '{key}': {msg}")


def _metrics(path: Path, raw: Any, margin: float) -> tuple[Metric, ...]:
    items = raw if isinstance(raw, list) else [raw]
    _need(len(items) > 0, path, "metric", "at least one metric")
    out = []
    for i, m in enumerate(items):
        key = f"metric[{i}]" if isinstance(raw, list) else "metric"
        _need(isinstance(m, dict), path, key, "a mapping with name, unit, direction")
        for k in ("name", "unit", "direction"):
            _need(isinstance(m.get(k), str) and m[k] != "", path, f"{key}.{k}", "a non-empty string")
        _need(m["direction"] in ("higher", "lower"), path, f"{key}.direction",
              f"'higher' or 'lower' (better), got {m['direction']!r}")
        mm = m.get("margin", margin)
        _need(isinstance(mm, (int, float)) and not isinstance(mm, bool), path, f"{key}.margin", "a number")
        _need(isinstance(m.get("decide", True), bool), path, f"{key}.decide", "true or false")
        out.append(Metric(m["name"], m["unit"], m["direction"], float(mm), int(m.get("decimals", 2)),
                          bool(m.get("decide", True))))
    names = [m.name for m in out]
    _need(len(set(names)) == len(names), path, "metric", f"metric names repeat: {names}")
    _need(out[0].decide, path, "metric", "the first metric is the headline one: it must decide (decide: true)")
    return tuple(out)


def load_design(path: Path) -> Design:
    """Read and validate a design file.

    Raises:
        DesignError: unreadable YAML, a missing key, or a key of the wrong type or value (the message
            names the file and the field).
    """
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DesignError(f"{path}: cannot read the design: {e}") from e
    _need(isinstance(raw, dict), path, "<top>", "the design must be a YAML mapping")
    for k in REQUIRED:
        _need(k in raw, path, k, "missing")
    cid = raw["id"]
    _need(isinstance(cid, str) and bool(_ID.match(cid)), path, "id", "lower-case letters, digits and '-'")
    _need(cid == path.stem, path, "id", f"must equal the file name's stem {path.stem!r}, got {cid!r}")
    for k in ("paper", "statement", "unit", "order", "warmup"):
        _need(isinstance(raw[k], str) and raw[k].strip() != "", path, k, "a non-empty string")
    _need(raw["label"] in ("real", "simulated"), path, "label", f"'real' or 'simulated', got {raw['label']!r}")
    arms = raw["arms"]
    _need(isinstance(arms, list) and len(arms) >= 2 and all(isinstance(a, str) and a for a in arms),
          path, "arms", "a list of at least two arm names (treatment first, baseline second)")
    _need(len(set(arms)) == len(arms), path, "arms", f"arm names repeat: {arms}")
    kind = raw["kind"]
    _need(kind in KINDS, path, "kind", f"one of {KINDS}, got {kind!r}")
    seeds = raw["seeds"]
    _need(isinstance(seeds, list) and len(seeds) >= 2 and all(isinstance(s, int) and not isinstance(s, bool)
                                                            for s in seeds),
          path, "seeds", "an explicit list of at least two integer seeds")
    _need(len(set(seeds)) == len(seeds), path, "seeds", f"seeds repeat: {seeds}")
    _need(min(seeds) >= FRESH_SEED_MIN, path, "seeds",
          f"confirmatory seeds are fresh: every seed >= {FRESH_SEED_MIN}, got {min(seeds)}")
    rule = raw["decision_rule"]
    _need(isinstance(rule, dict), path, "decision_rule", "a mapping with margin and rule")
    _need(isinstance(rule.get("margin"), (int, float)) and not isinstance(rule.get("margin"), bool),
          path, "decision_rule.margin", "a number")
    _need(isinstance(rule.get("rule"), str) and rule["rule"].strip() != "", path, "decision_rule.rule",
          "the rule in words")
    margin = float(rule["margin"])
    against = rule.get("against", [arms[1]])
    _need(isinstance(against, list) and len(against) >= 1 and all(a in arms[1:] for a in against), path,
          "decision_rule.against", f"a list of arms other than the treatment {arms[0]!r}, got {against!r}")
    if kind in ("non_inferiority", "equivalence"):
        _need(margin > 0, path, "decision_rule.margin", f"{kind} needs a margin > 0, got {margin}")
    metrics = _metrics(path, raw["metric"], margin)
    test = raw["test"]
    _need(isinstance(test, str) and test.strip() != "", path, "test", "the statistical test in words")
    if kind == "speed_ratio":
        _need("bootstrap" in test.lower() or "delta" in test.lower(), path, "test",
              "a speed_ratio claim is tested by the ratio of means with a delta-method ('delta') "
              "or bootstrap ('bootstrap') interval")
    else:
        _need("t-interval" in test.lower() or "t interval" in test.lower(), path, "test",
              f"a {kind} claim is tested by the paired t-interval (say 't-interval')")
    m = re.search(r"([\d,]+)\s+resamples", test)
    n_resamples = int(m.group(1).replace(",", "")) if m else 10_000
    m = re.search(r"rng seed\s+(\d+)", test)
    rng_seed = int(m.group(1)) if m else 0
    cmd = raw["command"]
    params = raw.get("params", {}) or {}
    if isinstance(cmd, dict):
        params = cmd.get("params", params) or {}
        cmd = cmd.get("callable")
    _need(isinstance(cmd, str) and bool(_COMMAND.match(cmd)), path, "command",
          f"'module:function' of run_seed(seed, arm_order, workdir, **params), got {cmd!r}")
    _need(isinstance(params, dict), path, "params", "a mapping of fixed keyword arguments")
    budget = raw["budget_minutes"]
    _need(isinstance(budget, (int, float)) and not isinstance(budget, bool) and budget > 0, path,
          "budget_minutes", f"a number > 0, got {budget!r}")
    runs_from = raw.get("runs_from")
    _need(runs_from is None or (isinstance(runs_from, str) and bool(_ID.match(runs_from)) and runs_from != cid),
          path, "runs_from", f"another claim's id, got {runs_from!r}")
    return Design(id=cid, path=path, sha256=sha256_of(path), paper=raw["paper"].strip(),
                  statement=raw["statement"].strip(), label=raw["label"], arms=tuple(arms), metrics=metrics,
                  kind=kind, unit=raw["unit"].strip(), seeds=tuple(seeds), test=test.strip(), margin=margin,
                  rule=rule["rule"].strip(), order=raw["order"].strip(), warmup=raw["warmup"].strip(),
                  command=cmd, params=dict(params), budget_minutes=float(budget), n_resamples=n_resamples,
                  rng_seed=rng_seed, ratio_interval="delta" if "delta" in test.lower() else "bootstrap",
                  against=tuple(against), runs_from=runs_from, raw=raw)
