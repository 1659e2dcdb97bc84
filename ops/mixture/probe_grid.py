"""The CPT probe grid and its results in the lake: which runs a set of (size, ratio) partitions
launches, their keys and folders, the reuse of committed base models, and the readers of the
finished probe tables (losses per checkpoint, the general-loss rise over each run's base, the base
losses per size).

Source: Que et al., "D-CPT Law", arXiv 2406.01375 §3 (the probe grid over N, D and the mixture
ratio r) and §4.1 (exponentially spaced checkpoints); docs/mixture.md, "Probe grid". The probe
worker that trains these runs is ``ops.mixture.probe``.

The readers take a ``lake``: any object with ``base`` (a local ``Path``), ``partitions(asset)``
(the asset's partition folder names) and ``read(asset, partition)`` (a Polars frame), as the
``resources.lake.LakeResource`` has. Errors are ``ValueError`` (bad grid or settings) and
``FileNotFoundError`` (a base model or probe table missing), each naming the size, init or
folder. Polars only: no torch, no Dagster.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol, Sequence

import polars as pl

from .probe import SIZES, ProbePlan, base_dir_name

DEFAULT_SIZES = "xs,s,m,l"
"""The probe sizes of the default grid (``CRUCIBLE_CPT_SIZES`` overrides; keys of ``probe.SIZES``)."""
DEFAULT_RATIOS = "0,0.25,0.5,0.75,1"
"""The domain ratios r_d of the default grid (``CRUCIBLE_CPT_RATIOS`` overrides; each in [0, 1])."""


class Lake(Protocol):  # pragma: no cover - a structural type
    base: Path

    def partitions(self, asset: str) -> list[str]: ...

    def read(self, asset: str, partition: str | None = None) -> pl.DataFrame: ...


def ratio_key(r: float) -> str:
    """A domain ratio's partition key: two decimals (0.5 -> '0.50')."""
    return f"{r:.2f}"


def grid_from_env(environ: Mapping[str, str] = os.environ) -> tuple[list[str], list[str]]:
    """(sizes, ratio keys) of the probe grid: ``CRUCIBLE_CPT_SIZES`` / ``CRUCIBLE_CPT_RATIOS``
    (comma-separated) or the defaults. Raises ValueError naming the variable for an unknown size
    or a ratio outside [0, 1]."""
    def items(name: str, default: str) -> list[str]:
        return [x.strip() for x in environ.get(name, default).split(",") if x.strip()]

    sizes = items("CRUCIBLE_CPT_SIZES", DEFAULT_SIZES)
    for s in sizes:
        if s not in SIZES:
            raise ValueError(f"CRUCIBLE_CPT_SIZES: unknown size {s!r}; known: {sorted(SIZES)}")
    ratios = []
    for x in items("CRUCIBLE_CPT_RATIOS", DEFAULT_RATIOS):
        try:
            r = float(x)
        except ValueError:
            raise ValueError(f"CRUCIBLE_CPT_RATIOS: {x!r} is not a number") from None
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"CRUCIBLE_CPT_RATIOS: ratio {x} outside [0, 1]")
        ratios.append(ratio_key(r))
    return sizes, ratios


def distinct_ints(values: Iterable, field: str, need_zero: bool = False) -> list[int]:
    """``values`` as sorted distinct integers >= 0, at least one (and holding 0 when ``need_zero``).
    Raises ValueError naming ``field`` (e.g. 'cpt_probe_runs.seeds') otherwise."""
    out = [int(v) for v in values]
    if not out or len(set(out)) != len(out) or min(out) < 0 or (need_zero and 0 not in out):
        raise ValueError(f"{field} must be distinct integers >= 0" + (" including 0" if need_zero else " (at least one)")
                         + f", got {list(values)}")
    return sorted(out)


def base_key(size: str, init: int) -> str:
    """A base run's key in the launch: ``size`` for init 0 (the key bases had before inits),
    ``size|i<init>`` otherwise."""
    return size + (f"|i{init}" if init else "")


def run_key(size: str, ratio: str, seed: int) -> str:
    """A probe run's key in the launch: ``size|ratio`` for seed 0 (the key runs had before seeds),
    ``size|ratio|s<seed>`` otherwise."""
    return f"{size}|{ratio}" + (f"|s{seed}" if seed else "")


def base_runs(sizes: Sequence[str], inits: Sequence[int]) -> list[dict]:
    """The base-model runs of ``sizes`` x ``inits`` (each {size, ratio 0, init, key})."""
    return [{"size": s, "ratio": 0.0, "init": i, "key": base_key(s, i)} for s in sizes for i in inits]


def seeds_at(ratio: str, seeds: Sequence[int], repeat_ratios: Iterable[float]) -> list[int]:
    """The seeds trained at ``ratio`` (a ratio key): all of ``seeds`` where ``repeat_ratios`` is empty
    or holds the ratio, else the first seed only."""
    repeat = {ratio_key(float(x)) for x in repeat_ratios}
    return list(seeds) if not repeat or ratio in repeat else list(seeds[:1])


def probe_runs(dims: Sequence[Mapping[str, str]], seeds: Sequence[int], repeat_ratios: Iterable[float],
               reinit_base: bool, size_order: Sequence[str]) -> list[dict]:
    """The CPT runs of the partitions ``dims`` ({'size', 'ratio'} each): one per seed of
    ``seeds_at``, seed k continuing base init k when ``reinit_base`` (else init 0); each {size, ratio
    (float), seed, init, key}, ordered by size (``size_order``), ratio, seed. Raises ValueError when
    there is none."""
    repeat_ratios = list(repeat_ratios)
    runs = sorted(({"size": d["size"], "ratio": float(d["ratio"]), "seed": seed, "init": seed if reinit_base else 0,
                    "key": run_key(d["size"], d["ratio"], seed)}
                   for d in dims for seed in seeds_at(d["ratio"], seeds, repeat_ratios)),
                  key=lambda r: (list(size_order).index(r["size"]) if r["size"] in size_order else 0, r["ratio"], r["seed"]))
    if not runs:
        raise ValueError(f"cpt_probe_runs: no run in partitions {[dict(d) for d in dims]} (seeds {list(seeds)})")
    return runs


def base_settings(base_dir: Path, runs: Sequence[Mapping]) -> dict:
    """The base settings (``base.json['settings']``) every base model that ``runs`` continue was
    trained with. Raises FileNotFoundError naming the size and init of a missing base, ValueError
    when two bases disagree."""
    settings = None
    for s, init in sorted({(r["size"], int(r.get("init", 0))) for r in runs}):
        p = Path(base_dir) / base_dir_name(s, init) / "base.json"
        if not p.exists():
            raise FileNotFoundError(f"cpt_probe_runs: no base model for size {s!r}, init {init} at {p} (seed {init} "
                                    f"continues base init {init}); materialize cpt_base_models[{s}] with inits holding "
                                    f"{init}, or set seeds_reinit_base false")
        st = json.loads(p.read_text())["settings"]
        if settings is not None and st != settings:
            raise ValueError(f"cpt_probe_runs: base models disagree on their settings ({s}: {st} vs {settings}); "
                             "re-materialize cpt_base_models for all sizes with one config")
        settings = st
    return settings or {}


def stage_committed_bases(plan: ProbePlan, committed: Path, stage: Path, log: Callable[[str], None]) -> None:
    """Hard-link (copy where links fail) every committed base of ``plan`` whose ``base.json`` carries
    this plan's fingerprint into the run's staging folder ``stage``, so the worker reuses it instead
    of training it again (it sees only its run folder) and the commit puts back the same bytes."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    for r in plan.runs:
        name = base_dir_name(r["size"], int(r.get("init", 0)))
        src, dst = committed / name, stage / name
        info = src / "base.json"
        if dst.exists() or not info.exists():
            continue
        if json.loads(info.read_text()).get("fingerprint") != plan.fingerprint(r["size"], init=int(r.get("init", 0))):
            continue
        tmp = stage / f".{name}.linking"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, copy_function=link)
        os.replace(tmp, dst)
        log(f"base {name}: the committed base matches this plan; staged for reuse")


def content_version(*parts: bytes) -> str:
    """16 hex digits of the SHA-256 of a partition's own content (``parts``, in order)."""
    h = hashlib.sha256()
    for b in parts:
        h.update(hashlib.sha256(b).digest())
    return h.hexdigest()[:16]


def base_rows(result_runs: Mapping[str, Mapping], runs: Sequence[Mapping]) -> list[dict]:
    """One row per base model of a finished base launch (``result_runs``: the worker's runs by key):
    size, init, n_params, n_params_total, tokens, loss_general, loss_domain (nats/token), wall_s,
    fingerprint."""
    out = []
    for r in runs:
        i = result_runs[r["key"]]
        out.append({"size": i["size"], "init": int(i.get("init", 0)), "n_params": i["n_params"],
                    "n_params_total": i["n_params_total"], "tokens": i["tokens"],
                    "loss_general": round(i["losses"]["general"], 4), "loss_domain": round(i["losses"]["domain"], 4),
                    "wall_s": i.get("wall_s"), "fingerprint": i["fingerprint"]})
    return out


def base_partition_meta(rows: Sequence[Mapping], size: str, stage: Path) -> dict:
    """The per-partition metadata of one size's bases (``rows`` of ``base_rows``; their folders under
    ``stage``): partition_data_version (the hash of every init's weights and base.json), rows,
    n_params, tokens and the init-mean losses."""
    mine = [r for r in rows if r["size"] == size]
    files = [stage / base_dir_name(size, r["init"]) / f for r in mine for f in ("model.safetensors", "base.json")]
    return {"partition_data_version": content_version(*(f.read_bytes() for f in files if f.exists())),
            "rows": len(mine), "n_params": mine[0]["n_params"], "tokens": mine[0]["tokens"],
            "loss_general": round(sum(r["loss_general"] for r in mine) / len(mine), 4),
            "loss_domain": round(sum(r["loss_domain"] for r in mine) / len(mine), 4)}


def probe_table(info: Mapping) -> pl.DataFrame:
    """One row per checkpoint of a finished run (``info``: the worker's record): n_params, tokens,
    domain_ratio, seed (the run's CPT data-order seed), init (its base initialisation),
    loss_general, loss_domain and loss_domain/<subdomain> columns (nats/token)."""
    df = pl.DataFrame(info["points"])
    return df.with_columns(size=pl.lit(info["size"]), domain_ratio=pl.lit(float(info["ratio"])),
                           seed=pl.lit(int(info.get("seed", 0)), dtype=pl.Int64),
                           init=pl.lit(int(info.get("init", 0)), dtype=pl.Int64),
                           n_params=pl.lit(int(info["n_params"])), n_params_total=pl.lit(int(info["n_params_total"])))


def partition_table(result_runs: Mapping[str, Mapping], size: str, ratio: str, seeds: Sequence[int]
                    ) -> tuple[pl.DataFrame, list[dict]]:
    """(the partition's table: every seed's checkpoints in (seed, tokens) order, one summary row per
    seed at its last checkpoint) for the (size, ratio) partition of a finished CPT launch."""
    tables, finals = [], []
    for seed in seeds:
        info = result_runs[run_key(size, ratio, seed)]
        df = probe_table(info)
        tables.append(df)
        last = df.sort("tokens").row(-1, named=True)
        finals.append({"size": size, "n_params": info["n_params"], "domain_ratio": float(ratio), "seed": seed,
                       "init": int(info.get("init", 0)), "tokens": last["tokens"],
                       "loss_general": round(last["loss_general"], 4), "loss_domain": round(last["loss_domain"], 4),
                       "checkpoints": df.height - 1, "wall_s": info.get("wall_s")})
    return pl.concat(tables, how="diagonal_relaxed").sort("seed", "tokens"), finals


def probe_partition_meta(df: pl.DataFrame, ratio: str, seeds: int) -> dict:
    """The per-partition metadata of a probe table: partition_data_version (hash of its Arrow IPC
    bytes), rows, seeds, domain_ratio, tokens and the seed-mean losses at the largest D."""
    last = df.filter(pl.col("tokens") == pl.col("tokens").max())
    return {"partition_data_version": content_version(df.write_ipc(None).getvalue()),
            "rows": df.height, "seeds": seeds, "domain_ratio": float(ratio), "tokens": int(last["tokens"][0]),
            "loss_general": round(float(last["loss_general"].mean()), 4),
            "loss_domain": round(float(last["loss_domain"].mean()), 4)}


def read_probe_runs(lake: Lake, folders: Sequence[str] | None = None) -> pl.DataFrame:
    """Every finished probe run's checkpoints in the lake (all partitions; ``folders``: only these
    partition folders), diagonally concatenated; a table written before probe runs had seeds reads
    as seed 0, one from before base inits as init 0. Empty frame when there is none."""
    names = lake.partitions("cpt_probe_runs")     # through the lake: local folders or object-store tables
    if folders is not None:
        names = [n for n in names if n in set(folders)]
    frames = [lake.read("cpt_probe_runs", n) for n in names]
    frames = [f if "seed" in f.columns else f.with_columns(seed=pl.lit(0, dtype=pl.Int64)) for f in frames]
    frames = [f if "init" in f.columns else f.with_columns(init=pl.lit(0, dtype=pl.Int64)) for f in frames]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def final_rises(runs: pl.DataFrame, n_params: int) -> pl.DataFrame:
    """Each probe run of one size at its largest D, with ``general_rise``: its general loss relative
    to its own base model's (the run's D = 0 point; null for a table without one), so a seed that
    continues another base initialisation is measured against that base. Columns: domain_ratio,
    seed, tokens, loss_general, loss_domain, loss_general_base, general_rise."""
    at = runs.filter(pl.col("n_params") == n_params)
    base = at.filter(pl.col("tokens") == 0).select("domain_ratio", "seed", loss_general_base=pl.col("loss_general"))
    last = at.filter(pl.col("tokens") == at["tokens"].max()).select("domain_ratio", "seed", "tokens", "loss_general", "loss_domain")
    return (last.join(base, on=["domain_ratio", "seed"], how="left")
            .with_columns(general_rise=(pl.col("loss_general") - pl.col("loss_general_base")) / pl.col("loss_general_base")))


def grid_at_largest(runs: pl.DataFrame, n_params: int) -> pl.DataFrame:
    """The probe grid at one size and its largest D: per domain ratio the seed-mean general and
    domain losses (nats/token), the seed-mean ``general_rise`` over each run's own base model
    (``final_rises``) and the number of seeds, sorted by ratio."""
    return (final_rises(runs, n_params).group_by("domain_ratio")
            .agg(pl.col("tokens").first(), pl.col("loss_general").mean(), pl.col("loss_domain").mean(),
                 pl.col("general_rise").mean(), seeds=pl.len()).sort("domain_ratio"))


def base_losses(lake: Lake, size: str, inits=None) -> tuple[dict[str, float], list[int]]:
    """A probe size's base losses (nats/token, per stream): the mean over its base initialisations,
    the size's expected base model, as the law's fit averages over the probes' seeds. Returns
    (losses, the inits averaged). An init k > 0 counts only if it is in ``inits`` (None: any; pass
    the inits the size's probe runs continued) and its fingerprint is the one init 0's settings
    and the current token data give (a base left over from other settings or data is ignored).
    Raises FileNotFoundError without init 0."""
    root = lake.base / "cpt_base_models"
    p0 = root / size / "base.json"
    if not p0.exists():
        raise FileNotFoundError(f"no base model for size {size!r} at {p0}; materialize cpt_base_models[{size}] first")
    first = json.loads(p0.read_text())
    infos, used = [first], [0]
    manifest = lake.base / "cpt_tokenizer" / "manifest.json"
    if manifest.exists() and "settings" in first:              # a record without its settings: init 0 alone
        plan = ProbePlan.from_settings(phase="base", data_dir=str(manifest.parent), base_dir=str(root), out_dir="",
                                       **first["settings"])
        if first.get("fingerprint") == plan.fingerprint(size):     # init 0 is of these settings and data
            for p in sorted(root.glob(f"{size}_i*/base.json")):
                info = json.loads(p.read_text())
                k = int(info.get("init", 0))
                if (k > 0 and p.parent.name == base_dir_name(size, k) and (inits is None or k in set(inits))
                        and info.get("fingerprint") == plan.fingerprint(size, init=k)):
                    infos.append(info)
                    used.append(k)
    return {k: sum(i["losses"][k] for i in infos) / len(infos) for k in first["losses"]}, used


def probed_bases(base: Path, sizes: Sequence[str]) -> dict[str, dict]:
    """base.json of every size in ``sizes`` that has an init-0 base model under ``base``/cpt_base_models,
    by size name. Raises ValueError when two disagree on their settings, FileNotFoundError when there
    is none."""
    out, settings = {}, None
    for s in sizes:
        p = Path(base) / "cpt_base_models" / s / "base.json"
        if p.exists():
            info = json.loads(p.read_text())
            if settings is not None and info["settings"] != settings:
                raise ValueError(f"mixture_validation: base models disagree on their settings ({s}); "
                                 "re-materialize cpt_base_models for all sizes with one config")
            settings, out[s] = info["settings"], info
    if not out:
        raise FileNotFoundError("mixture_validation: no base model under cpt_base_models; materialize cpt_base_models first")
    return out


def probe_cpt_settings(base: Path, size: str) -> dict:
    """The CPT hyper-parameters the probes of ``size`` were trained with (their metrics.json under
    ``base``/cpt_probe_runs), so the validation runs continue the base exactly as the probes did; the
    ProbePlan defaults for probes recorded before the settings were. By flat setting name
    (``ProbePlan.FLAT_SCHEDULE``: ``cpt_lr``, ``cpt_warmup_steps``, ...), for ``ProbePlan.from_settings``."""
    for p in sorted((Path(base) / "cpt_probe_runs").glob(f"{size}_r*/metrics.json")):
        st = json.loads(p.read_text()).get("cpt_settings")
        if st:
            return {k: v for k, v in st.items() if k != "cpt_tokens"}
    plan = ProbePlan(phase="base", data_dir="", base_dir="", out_dir="")
    return {k: v for k, v in plan.cpt_settings().items() if k != "cpt_tokens"}


def subdomain_points(runs: pl.DataFrame, shares: Mapping[str, float], min_share: float) -> pl.DataFrame:
    """Long table for the Cross-Domain law (arXiv 2406.01375 §3.2): one row per (run, checkpoint,
    sub-domain) with the sub-domain's own mixture ratio r = r_d * share (its share of CPT tokens)
    and its loss; sub-domains under ``min_share`` or without a loss column are left out."""
    frames = []
    for sub, share in shares.items():
        col = f"loss_domain/{sub}"
        if share < min_share or col not in runs.columns:
            continue
        frames.append(runs.filter(pl.col("tokens") > 0).select(
            "n_params", "tokens", domain=pl.lit(sub),
            domain_ratio=pl.col("domain_ratio") * share, loss_domain=pl.col(col),
            loss_general=pl.col("loss_general")))
    return pl.concat(frames) if frames else pl.DataFrame()
