"""CPT probe worker: pre-train a GPT-2-style model on the general corpus, then continually pre-train
it on a general/domain mixture, recording validation losses at exponentially spaced token counts.

These runs are the data of the D-CPT Law (arXiv 2406.01375 §3: losses over model size N, tokens D and
mixture ratio r; §4.1 favours exponentially spaced checkpoints; docs/mixture.md, "Probe grid").
Launched by the ``cpt_base_models`` / ``cpt_probe_runs`` assets through the launch protocol
(``python -m ops.mixture.probe --spec --out --fingerprint`` under ``accelerate launch -m``: data
parallel over the ranks, gloo on CPU, NCCL on GPU); the spec is a ``ProbePlan``. Rank 0 streams
every checkpoint's losses as a Pipes custom message. The training loop, checkpoints and data
streams are the LM substrate's (``ops.lm``).

Outputs: ``<base_dir>/<size>/`` (the base model folder + ``base.json``) and ``<out_dir>/<run>/
metrics.json``, each record carrying its fingerprint; ``launch.json`` (world size) beside them. A
killed CPT run resumes from its last checkpoint in the launch's run folder; a finished run with the
same fingerprint is reused.

Seeds: a CPT run may carry a ``seed`` (its data-order seed: the probes have no dropout, so the seed
changes exactly which blocks of the two corpora each step draws) and an ``init`` (the base model it
continues, below). Repeated runs at one (size, ratio) measure the noise the law's fit cannot
explain (docs/mixture.md, "Closed loop"). Seed 0 keeps the
stream seeds, fingerprint and folder name that runs had before seeds existed, so their results are
reused. A run may also carry its own ``tokens`` (its CPT budget D instead of the plan's
``cpt_tokens``), as the closed-loop validation runs do.

Base initialisations: a size may have several base models, one per ``init`` (``init_seed_offset``
re-draws both the weights and the base's data order; init 0 is the base every run had before
inits existed, at ``<base_dir>/<size>/``, init k > 0 at ``<size>_i<k>/``). A CPT run carrying
``init`` continues that base. The probe assets pair CPT seed k with base init k, so repeated probes
are whole replicates and their spread includes the initialisation noise, as a model of another
size (or a validation model) differs from the law's probes by both (docs/mixture.md, "Noise ceiling").
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal, Optional, get_args

import numpy as np

from ops.launch import spec_fingerprint, worker_main
from ops.lm.schedule import LrSchedule
from ops.lm.spec import JsonSpec, build, require

# GPT-2 shapes of the probe sizes: non-embedding parameters ~ 12 * n_layer * n_embd^2.
SIZES: dict[str, dict[str, int]] = {
    # Depth grows with width. At probe scale (~100 optimizer steps of base training) the loss
    # differences between sizes are ~0.1 nats and single-seed noise is ~0.05-0.1 nats, so the
    # default grid spans ~70x in N to keep the N axis of the law above the noise (measured:
    # width-48 models were no better than width-32 ones at this budget).
    "xs": {"n_embd": 16, "n_layer": 2, "n_head": 2},   # ~6.6k non-embedding parameters
    "s": {"n_embd": 32, "n_layer": 2, "n_head": 2},    # ~25k
    "m": {"n_embd": 64, "n_layer": 3, "n_head": 4},    # ~150k
    "l": {"n_embd": 96, "n_layer": 4, "n_head": 4},    # ~448k
    "xl": {"n_embd": 128, "n_layer": 6, "n_head": 4},  # ~1.2M
    "xl4": {"n_embd": 160, "n_layer": 6, "n_head": 5},  # ~1.86M: 4.15x l, the D-CPT extrapolation check's smallest size
    "xxl": {"n_embd": 192, "n_layer": 8, "n_head": 6},  # ~3.5M
}


PROBE_SEEDS: tuple[int, ...] = (0, 1, 2, 3)
"""CPT data-order seeds of the probe runs (``cpt_probe_runs.seeds``). Two is the fewest that
measure the noise floor: the spread of repeated runs at one (N, D, r_d), which no law can fit below
(docs/mixture.md, "Closed loop"). Seed k continues the size's base initialisation k
(``PROBE_BASE_INITS``), so the seeds measure the noise of the whole run, initialisation and data
order, not only the CPT stage's. Four, so that each size's point on the N axis averages four base
models (docs/mixture.md, "Probe grid")."""

PROBE_BASE_INITS: tuple[int, ...] = (0, 1, 2, 3)
"""Base initialisations per probe size (``cpt_base_models.inits``). With CPT seed k continuing base
init k (``cpt_probe_runs.seeds_reinit_base``), a probe's repeats differ in initialisation and data
order, and at the repeat ratio (``PROBE_REPEAT_RATIOS``) a size's points average four base models
(the other ratios have seed 0, so init 0, only). Measured (docs/mixture.md, "Probe
grid"; exploratory): a probe size's base general loss varies by up to 4.5%
over four inits, and with two inits per size the extrapolation to 4x the largest probe moved by
more between two draws than between law forms."""

PROBE_REPEAT_RATIOS: tuple[float, ...] = (0.5,)
"""The ratios at which the seeds after the first are trained (``cpt_probe_runs.repeat_ratios``;
empty = every ratio): the middle ratio, at every size. The first seed covers the whole grid. Three
more seeds at one ratio cost as many runs as one more seed at three (32 probe runs either way),
which keeps the main job's mixture group inside its 6-minute budget on 2 cores, while each size's
N-axis point averages four base models instead of two."""


Parallelism = Literal["auto", "runs", "data"]
PARALLELISMS: tuple[str, ...] = get_args(Parallelism)
"""The values of ``ProbePlan.parallelism``."""

DATA_PARALLEL_EFFICIENCY: float = 0.75
"""Speedup of data parallelism over one process, per rank, for the probe sizes on CPU: one CPT run
of ``l`` took 25.5 s on one process and ~16 s on the embedded profile's 2 ranks (1.5x of 2x;
measured 2026-12-03, docs/mixture.md "Known limits"). ``choose_parallelism`` compares with it."""


def run_cost(plan: "ProbePlan", run: dict, vocab_size: int) -> float:
    """Estimated training FLOPs of one run (relative units for scheduling only): 6 x (non-embedding
    parameters 12 n_layer n_embd^2 + the tied output layer vocab_size n_embd) x its tokens (the
    base phase: ``base_tokens``; a CPT run: its own ``tokens`` or ``cpt_tokens``)."""
    shape = plan.sizes[run["size"]]
    n = 12 * shape["n_layer"] * shape["n_embd"] ** 2 + vocab_size * shape["n_embd"]
    tokens = plan.base_tokens if plan.phase == "base" else (run.get("tokens") or plan.cpt_tokens)
    return 6.0 * n * float(tokens)


def assign_runs(costs: list[float], ranks: int) -> list[list[int]]:
    """Longest-processing-time-first assignment of runs (by index) to ``ranks`` ranks: the costliest
    run goes to the least-loaded rank, ties to the lower rank. Deterministic; each rank's list is in
    the plan's order. Raises ValueError when ``ranks`` < 1."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    loads, out = [0.0] * ranks, [[] for _ in range(ranks)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(ranks), key=lambda r: (loads[r], r))
        loads[r] += costs[i]
        out[r].append(i)
    return [sorted(x) for x in out]


def choose_parallelism(costs: list[float], ranks: int, requested: str = "auto") -> str:
    """``requested`` unless "auto"; then "runs" when the longest rank's load under ``assign_runs``
    is below the data-parallel estimate sum(costs) / (ranks x ``DATA_PARALLEL_EFFICIENCY``), else
    "data". One rank: "data" (nothing to share)."""
    if requested != "auto":
        return requested
    if ranks <= 1 or not costs:
        return "data"
    makespan = max(sum(costs[i] for i in idx) for idx in assign_runs(costs, ranks))
    return "runs" if makespan < sum(costs) / (ranks * DATA_PARALLEL_EFFICIENCY) else "data"


@dataclass
class ProbePlan(JsonSpec):
    """The spec of one probe launch. Token counts are in tokens (not sequences); ``global_batch`` in
    sequences per optimizer step over all ranks. ``validate`` raises ValueError naming the field."""

    phase: str
    """What the launch trains: "base" (pre-train each size's base model) or "cpt" (continue one)."""
    data_dir: str
    """Folder of the token streams and their manifest.json (``ops.mixture.tokens``)."""
    base_dir: str
    """Root of the base models: ``<base_dir>/<size>/`` holds a size's base model and base losses."""
    out_dir: str
    """Root of the CPT results: ``<out_dir>/<run>/metrics.json`` per CPT run."""
    runs: list[dict] = field(default_factory=list)
    """[{"size": "xs", "ratio": 0.25, "key": "...", "seed": 0, "tokens": None, "init": 0}]: ``seed``
    (int >= 0, default 0) is a CPT run's data-order seed, ``tokens`` (int >= 1, default
    ``cpt_tokens``) its own CPT budget D, both ignored by the base phase; ``init`` (int >= 0,
    default 0) the base initialisation the base phase trains and a CPT run continues."""
    parallelism: Parallelism = "auto"
    """How the launch's ranks share its runs: "data" (every rank takes a slice of every run's
    global batch, gradients all-reduced), "runs" (each rank trains whole runs alone, assigned by
    ``assign_runs``), or "auto": "runs" when its estimated makespan beats data parallelism at
    ``DATA_PARALLEL_EFFICIENCY`` (``choose_parallelism``). Same global batch, data order and
    optimizer either way: a run's numbers agree up to float rounding, and its fingerprint does not
    depend on it."""
    sizes: dict = field(default_factory=lambda: dict(SIZES))
    """Probe size name -> GPT-2 shape ``{n_embd, n_layer, n_head}`` (n_embd a multiple of n_head)."""
    seq_len: int = 128
    """Context length of the probes (tokens per sequence)."""
    global_batch: int = 16
    """Sequences per optimizer step, summed over ranks (a multiple of the number of ranks)."""
    base_tokens: int = 200_000
    """General-corpus tokens of the base pre-training of each size."""
    base_schedule: LrSchedule = field(default_factory=lambda: LrSchedule(lr=3e-3, warmup_steps=10, min_lr_ratio=1.0,
                                                                        weight_decay=0.01))
    """AdamW schedule of the base pre-training (``ops.lm.schedule.LrSchedule``): peak rate 3e-3 after a
    10-step linear warm-up, then constant (min_lr_ratio 1.0), so the base ends at the rate the CPT
    continues with (no re-warming transient in the early checkpoints); weight decay 0.01."""
    lr_ref_width: int = 48
    """Width (``n_embd``) at which ``base_schedule.lr`` and ``cpt_schedule.lr`` hold; a size of width d >= lr_ref_width
    trains at lr x lr_ref_width / d, base and CPT alike (``lr_for``): the 1/width rule for Adam of muP
    (Yang et al., 2022, "Tensor Programs V", Table 3); a narrower size at lr itself unless
    ``lr_rule_below_ref``. 0: every size at the same rate. Measured (exploratory;
    docs/mixture.md, "Probe grid"): at one rate of 3e-3 every size beyond ``l`` was *worse* than ``l``
    after the base (general loss 5.69 for ``l``, 5.72 for ``xxl``), at the rule's 7.5e-4 ``xxl`` reaches 5.10."""
    lr_rule_below_ref: bool = False
    """Apply the 1/width rule below ``lr_ref_width`` too, raising a narrower size's rate above the
    given one (``xs``, width 16, at 3x). Off by default: a size narrower than the reference trains at
    the given rate. Measured (docs/mixture.md, "Probe grid"; exploratory): at 3x
    (9e-3) ``xs``'s base loss moved 2.8% between two CPU kernel paths of the same machine, and at 3e-3
    by 0.009%; the rule (Yang et al., 2022) scales up from a base width, not down."""
    cpt_tokens: int = 131_072
    """CPT tokens per run: the largest D."""
    first_checkpoint: int = 4_096
    """Tokens at the first validation checkpoint; later ones double up to cpt_tokens (paper §4.1)."""
    cpt_schedule: LrSchedule = field(default_factory=lambda: LrSchedule(lr=3e-3, warmup_steps=0, min_lr_ratio=1.0,
                                                                       weight_decay=0.01))
    """AdamW schedule of the CPT runs: by default the base's rate and weight decay, continued constant
    without re-warming (warm-up 0, min_lr_ratio 1.0)."""
    val_seqs_general: int = 48
    """Validation blocks of the general stream (the first ones)."""
    val_seqs_per_subdomain: int = 24
    """Validation blocks per domain sub-domain; the domain loss is their token-weighted mean."""
    seed: int = 0
    """Weight initialisation and data order."""
    # The settings a record (base.json "settings", metrics.json "cpt_settings", a registered design) and the
    # fingerprint name, flat, by the names they had before the schedules were parts (``FLAT_SCHEDULE``).
    BASE_FIELDS = ("seq_len", "global_batch", "base_tokens", "base_lr", "lr_ref_width", "lr_rule_below_ref", "warmup_steps",
                   "weight_decay", "val_seqs_general", "val_seqs_per_subdomain", "seed")
    _HASH_IF_IT_MATTERS = ("lr_rule_below_ref",)   # hashed through the rate it gives (fingerprint)
    CPT_FIELDS = ("cpt_tokens", "first_checkpoint", "cpt_lr", "cpt_warmup_steps")
    #: flat setting name -> (schedule part, field); the last three are named (recorded, hashed) only when they
    #: differ from what the flat plan implied: constant rates, the CPT at the base's weight decay
    FLAT_SCHEDULE = {"base_lr": ("base_schedule", "lr"), "warmup_steps": ("base_schedule", "warmup_steps"),
                     "weight_decay": ("base_schedule", "weight_decay"), "cpt_lr": ("cpt_schedule", "lr"),
                     "cpt_warmup_steps": ("cpt_schedule", "warmup_steps"),
                     "base_min_lr_ratio": ("base_schedule", "min_lr_ratio"),
                     "cpt_min_lr_ratio": ("cpt_schedule", "min_lr_ratio"), "cpt_weight_decay": ("cpt_schedule", "weight_decay")}

    @classmethod
    def from_settings(cls, **kw) -> "ProbePlan":
        """A plan from keyword fields whose schedules may also be given by their flat setting names
        (``FLAT_SCHEDULE``: base.json settings, metrics.json cpt_settings, a design's params): a flat
        name sets its part's field over the part given (a dict or ``LrSchedule``) or its default;
        ``weight_decay`` sets the CPT's too when no ``cpt_schedule`` part and no ``cpt_weight_decay``
        is given (the flat plan's one weight decay). Not validated. Raises ValueError naming an
        unknown field."""
        flat = {k: kw.pop(k) for k in list(kw) if k in cls.FLAT_SCHEDULE}
        if "weight_decay" in flat and "cpt_schedule" not in kw:
            flat.setdefault("cpt_weight_decay", flat["weight_decay"])
        plan = build(cls, kw)
        for name, v in flat.items():              # a copy of the part: a given LrSchedule is never changed
            part, f = cls.FLAT_SCHEDULE[name]
            setattr(plan, part, replace(getattr(plan, part), **{f: v}))
        return plan

    @classmethod
    def nest_settings(cls, flat: dict) -> dict:
        """``flat`` (run config or settings by flat name, e.g. a registered design's params) as the
        nested run config of the probe assets: each ``FLAT_SCHEDULE`` name moves to its part
        (``{"base_lr": 1e-3}`` -> ``{"base_schedule": {"lr": 1e-3}}``, the part's other fields left to
        the Config's defaults); other keys pass through."""
        out: dict = {}
        for k, v in flat.items():
            part, f = cls.FLAT_SCHEDULE.get(k, (None, k))
            if part:
                out.setdefault(part, {})[f] = v
            else:
                out[k] = v
        return out

    def setting(self, name: str):
        """The value of a flat setting name (a field, or a schedule field by its ``FLAT_SCHEDULE`` name)."""
        part, f = self.FLAT_SCHEDULE.get(name, (None, name))
        return getattr(getattr(self, part), f) if part else getattr(self, name)

    def _schedule_extras(self, cpt: bool) -> dict:
        """The schedule settings the flat plan could not express, by flat name, when they are not its
        implied values: the base's min_lr_ratio (``cpt``: the CPT's min_lr_ratio and weight decay)."""
        names = ("cpt_min_lr_ratio", "cpt_weight_decay") if cpt else ("base_min_lr_ratio",)
        implied = {"base_min_lr_ratio": 1.0, "cpt_min_lr_ratio": 1.0, "cpt_weight_decay": self.base_schedule.weight_decay}
        return {k: self.setting(k) for k in names if self.setting(k) != implied[k]}

    def validate(self, processes: Optional[int] = None) -> "ProbePlan":
        """Check every field (and, with ``processes``, that the global batch splits over the ranks).
        Returns the plan. Raises ValueError naming the field."""
        from ops.lm.train import check_global_batch

        require("probe", self, [
            ("phase", self.phase in ("base", "cpt"), "'base' or 'cpt'"),
            ("parallelism", self.parallelism in PARALLELISMS, " or ".join(map(repr, PARALLELISMS))),
            *((k, getattr(self, k) >= 1, ">= 1") for k in ("seq_len", "base_tokens", "cpt_tokens", "first_checkpoint",
                                                           "val_seqs_general", "val_seqs_per_subdomain")),
            ("lr_ref_width", self.lr_ref_width >= 0, ">= 0")])
        self.base_schedule.validate("probe.base_schedule")
        self.cpt_schedule.validate("probe.cpt_schedule")
        check_global_batch(self.global_batch, processes)
        for name, shape in self.sizes.items():
            if set(shape) != {"n_embd", "n_layer", "n_head"} or shape["n_embd"] % shape["n_head"]:
                raise ValueError(f"probe.sizes[{name!r}] must be {{n_embd, n_layer, n_head}} with n_embd a multiple "
                                 f"of n_head, got {shape}")
        for r in self.runs:
            if r.get("size") not in self.sizes:
                raise ValueError(f"probe run {r.get('key')!r}: unknown probe size {r.get('size')!r}; known: {sorted(self.sizes)}")
            if not 0.0 <= float(r.get("ratio", -1)) <= 1.0:
                raise ValueError(f"probe run {r.get('key')!r}: domain ratio {r.get('ratio')} outside [0, 1]")
            for k in ("seed", "init"):
                v = r.get(k, 0)
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"probe run {r.get('key')!r}: {k} must be an integer >= 0, got {v!r}")
            tokens = r.get("tokens")
            if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
                raise ValueError(f"probe run {r.get('key')!r}: tokens must be an integer >= 1 (or absent), got {tokens!r}")
        return self

    def fingerprint(self, size: str, ratio: float | None = None, seed: int = 0, tokens: int | None = None,
                    init: int = 0) -> str:
        """Hash of what determines a result: the data manifest, the size's shape, the base
        hyper-parameters, the base initialisation ``init``, and for a CPT run (``ratio`` given) the
        CPT hyper-parameters, the ratio, the run's CPT budget ``tokens`` (None: ``cpt_tokens``) and
        its data-order ``seed``. Seed 0 and init 0 hash exactly as before seeds and inits existed
        (their published results stay valid), and so does a size whose rate ``lr_rule_below_ref``
        leaves unchanged (every size at least ``lr_ref_width`` wide); a size it changes hashes its
        rate. The schedules hash by their flat names (``FLAT_SCHEDULE``), as before they were parts,
        plus what the flat plan could not express when it is set (``_schedule_extras``). 16 hex digits."""
        manifest = (Path(self.data_dir) / "manifest.json").read_text()
        fields = self.BASE_FIELDS + (self.CPT_FIELDS if ratio is not None else ())
        d = {k: self.setting(k) for k in fields if k not in self._HASH_IF_IT_MATTERS}
        payload: list = [manifest, self.sizes.get(size), d, ratio]
        if extras := {**self._schedule_extras(False), **(self._schedule_extras(True) if ratio is not None else {})}:
            payload.append({"schedule": extras})
        if size in self.sizes and self.lr_multiplier(size) != self.lr_multiplier(size, below_ref=True):
            payload.append({"lr_multiplier": self.lr_multiplier(size)})
        if init:
            payload.append({"base_init": int(init)})
        if ratio is not None:
            if tokens is not None:
                d["cpt_tokens"] = int(tokens)
            if seed:
                payload.append({"cpt_seed": int(seed)})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def launch_fingerprint(self) -> str:
        """The launch's fingerprint (``ops.launch.spec_fingerprint`` of the plan and the manifest)."""
        return spec_fingerprint(asdict(self), str(Path(self.data_dir) / "manifest.json"))

    def lr_multiplier(self, size: str, below_ref: Optional[bool] = None) -> float:
        """What ``size``'s rate is multiplied by: lr_ref_width / n_embd, at most 1 unless the rule
        applies below the reference width (``below_ref``; None: ``lr_rule_below_ref``); 1 when
        lr_ref_width is 0. Raises KeyError for an unknown size."""
        if not self.lr_ref_width:
            return 1.0
        m = self.lr_ref_width / self.sizes[size]["n_embd"]
        return m if (self.lr_rule_below_ref if below_ref is None else below_ref) else min(1.0, m)

    def lr_for(self, size: str, lr: float) -> float:
        """The learning rate ``size`` trains at for a rate ``lr`` given at width ``lr_ref_width``:
        lr x ``lr_multiplier(size)`` (lr x lr_ref_width / n_embd, never above ``lr`` unless
        ``lr_rule_below_ref``; ``lr`` itself when lr_ref_width is 0). Raises KeyError for an unknown size."""
        return lr * self.lr_multiplier(size)

    def base_settings(self) -> dict:
        """The settings a CPT launch must share with the base models it starts from, by flat name
        (``FLAT_SCHEDULE``; ``from_settings`` reads them back)."""
        return {**{k: self.setting(k) for k in self.BASE_FIELDS}, **self._schedule_extras(False)}

    def cpt_settings(self) -> dict:
        """The CPT settings by flat name (``cpt_tokens`` included; ``from_settings`` reads them back)."""
        return {**{k: self.setting(k) for k in self.CPT_FIELDS}, **self._schedule_extras(True)}


def run_dir_name(size: str, ratio: float, seed: int = 0, tokens: int | None = None, init: int = 0) -> str:
    """The folder (and lake table) name of a CPT run: ``<size>_r<ratio>``, then ``_s<seed>`` for a
    seed other than 0, ``_D<tokens>`` for a run with its own CPT budget and ``_i<init>`` for a run
    continuing a base initialisation other than 0."""
    return (f"{size}_r{ratio:.3f}" + (f"_s{seed}" if seed else "") + (f"_D{tokens}" if tokens is not None else "")
            + (f"_i{init}" if init else ""))


def base_dir_name(size: str, init: int = 0) -> str:
    """The folder of a base model under ``base_dir``: ``<size>`` for init 0 (the folder bases had
    before inits existed), ``<size>_i<init>`` otherwise."""
    return size + (f"_i{init}" if init else "")


def init_seed_offset(init: int) -> int:
    """What base initialisation ``init`` adds to the weight seed and to the base's stream seeds: 0
    for init 0, else a multiple of 10^9, beyond every base/ratio/CPT-seed offset."""
    return 1_000_000_000 * int(init)


def cpt_seed_offset(seed: int) -> int:
    """What a CPT run's data-order ``seed`` adds to its stream seeds: 0 for seed 0 (the streams of
    runs made before seeds existed), else a multiple of 10^7, beyond every base/ratio offset."""
    return 10_000_000 * int(seed)


def checkpoint_tokens(plan: ProbePlan, cpt_tokens: int | None = None) -> list[int]:
    """Exponentially spaced CPT token counts (multiples of the global batch), from
    ``first_checkpoint`` doubling and ending at ``cpt_tokens`` (None: the plan's)."""
    per_step = plan.global_batch * plan.seq_len
    budget = plan.cpt_tokens if cpt_tokens is None else int(cpt_tokens)
    out, t = [], plan.first_checkpoint
    while t < budget:
        out.append(t)
        t *= 2
    out.append(budget)
    steps = sorted({max(1, math.ceil(x / per_step)) for x in out})
    return [s * per_step for s in steps]


def points_budget(plan: ProbePlan, tokens: int | None = None) -> int:
    """The CPT tokens a run with budget ``tokens`` (None: the plan's) really trains: its last
    checkpoint, the budget rounded up to whole global batches."""
    return checkpoint_tokens(plan, tokens)[-1]


class _Probe:
    """What every run of one launch shares: the plan, the ranks, the manifest and the validation
    blocks (general, and each sub-domain with at least one block)."""

    def __init__(self, plan: ProbePlan, dp, pipes, manifest: dict):
        from ops.lm.data import first_blocks

        self.plan, self.dp, self.pipes, self.log = plan, dp, pipes, pipes.log.info
        self.manifest = manifest
        self.val = {"general": first_blocks(self.load("general_val"), plan.seq_len, plan.val_seqs_general)}
        for s in self.manifest["subdomains"]:
            blocks = first_blocks(self.load(f"domain_{s}_val"), plan.seq_len, plan.val_seqs_per_subdomain)
            if len(blocks):
                self.val[f"domain/{s}"] = blocks
        self.per_step = plan.global_batch * plan.seq_len

    def load(self, name: str) -> np.ndarray:
        return np.load(Path(self.plan.data_dir) / f"{name}.npy", mmap_mode="r")

    def model(self, size: str, init: int = 0):
        from ops.lm.model import gpt2, param_counts

        m = gpt2(self.manifest["vocab_size"], self.plan.seq_len, self.manifest["eot_id"], self.plan.sizes[size],
                 self.plan.seed + init_seed_offset(init))
        return m, *param_counts(m)

    def batches(self, ratio_seed: int, ratio: float, cpt_seed: int = 0, init: int = 0):
        """General and domain blocks at domain ratio ``ratio`` (domain rows first in each batch), in
        the order of ``cpt_seed`` (``cpt_seed_offset``) and, for a base, of its ``init``
        (``init_seed_offset``)."""
        from ops.lm.data import BlockStream, MixedBatches

        seed = self.plan.seed * 1000 + ratio_seed + cpt_seed_offset(cpt_seed) + init_seed_offset(init)
        L = self.plan.seq_len
        general = BlockStream(self.load("general_train"), L, seed, "general_train")
        domain = BlockStream(self.load("domain_train"), L, seed + 1, "domain_train")
        return MixedBatches(domain, general, self.plan.global_batch, ratio, name="probe batches")

    def losses(self, model) -> dict[str, float]:
        """Validation loss per stream (nats/token) and ``domain``: token-weighted over the
        sub-domains (the whole domain validation set)."""
        from ops.lm.evaluate import stream_losses

        out = stream_losses(model, self.val, self.dp)
        dom = [(self.val[k].shape[0], out[k]) for k in self.val if k.startswith("domain/")]
        out["domain"] = sum(n * v for n, v in dom) / max(sum(n for n, _ in dom), 1)
        return out

    def reused(self, key: str, info: Optional[dict]) -> Optional[dict]:
        if info is not None:
            self.pipes.report_custom_message({"run": key, "reused": True})
        return info

    def base(self, run: dict, out: Path) -> dict:
        """Pre-train base initialisation ``run["init"]`` (default 0) of ``run["size"]`` and publish
        it (or reuse the published one)."""
        from ops.lake import write_json_atomic
        from ops.lm.checkpoint import published
        from ops.lm.model import save_model
        from ops.lm.train import Trainer, token_mean_loss
        from ops.mixture.plateau import PLATEAU_FRACTION, plateau_record

        plan, size, init, t0 = self.plan, run["size"], int(run.get("init", 0)), time.monotonic()
        name = base_dir_name(size, init)
        folder, fp = Path(plan.base_dir) / name, plan.fingerprint(size, init=init)
        if (info := self.reused(run["key"], published(folder / "base.json", fp, self.log, f"base {name}"))) is not None:
            return info
        model, n_params, n_total = self.model(size, init)
        sch = plan.base_schedule
        opt = sch.optimizer(model, lr=plan.lr_for(size, sch.lr))
        steps = max(1, math.ceil(plan.base_tokens / self.per_step))
        trainer = Trainer(self.dp, model, opt, sch.scheduler(opt, steps), self.batches(0, 0.0, init=init),
                          token_mean_loss, name=f"base {name}", log=self.log)
        # The plateau criterion (ops.mixture.validation.plateau_record): the general validation loss at 80% of
        # the steps and at the end. Evaluation draws no random numbers and leaves the training unchanged.
        at80 = max(1, int(round((1.0 - PLATEAU_FRACTION) * steps))) if steps > 1 else None
        if at80 is not None and at80 < steps:
            trainer.train(at80)
            loss80 = trainer.evaluate(self.losses)["general"]
        trainer.train(steps)
        losses = trainer.evaluate(self.losses)
        plateau = (plateau_record(loss80, losses["general"]) | {"step_at_80pct": at80, "steps": steps}
                   if at80 is not None and at80 < steps else None)
        info = {"fingerprint": fp, "size": size, "init": init, "settings": plan.base_settings(), "n_params": n_params,
                "n_params_total": n_total, "tokens": steps * self.per_step, "steps": steps, "lr": plan.lr_for(size, sch.lr),
                "losses": losses, "plateau": plateau,
                "wall_s": round(time.monotonic() - t0, 2), "world_size": self.dp.world}
        if self.dp.rank == 0:
            # the optimizer too: CPT continues training (Adam moments included)
            save_model(trainer.unwrapped, folder, trainer.optimizer)
            write_json_atomic(info, folder / "base.json", indent=1)
            self.pipes.report_custom_message({"run": run["key"], **info})
            self.log(f"base {name}: N={n_params} loss_general={losses['general']:.4f} "
                     f"loss_domain={losses['domain']:.4f} in {info['wall_s']} s")
        self.dp.barrier()
        return info

    def cpt(self, run: dict, out: Path) -> dict:
        """Continually pre-train ``run["size"]``'s base at ``run["ratio"]``, evaluating and saving a
        checkpoint at every mark of ``checkpoint_tokens``; publish ``metrics.json``."""
        from ops.lake import write_json_atomic
        from ops.lm.checkpoint import LMState, published, run_folder
        from ops.lm.model import load_model
        from ops.lm.train import Trainer, crash_if_asked, token_mean_loss

        plan, size, ratio, key, t0 = self.plan, run["size"], float(run["ratio"]), run["key"], time.monotonic()
        seed, budget, init = int(run.get("seed", 0)), run.get("tokens"), int(run.get("init", 0))
        base = Path(plan.base_dir) / base_dir_name(size, init)
        base_info = json.loads((base / "base.json").read_text()) if (base / "base.json").exists() else None
        if base_info is None or base_info.get("fingerprint") != plan.fingerprint(size, init=init):
            raise FileNotFoundError(f"run {key}: no base model for size {size!r} (init {init}) under {base} matching "
                                    "these base settings; materialize cpt_base_models (size partition) first")
        name, fp = run_dir_name(size, ratio, seed, budget, init), plan.fingerprint(size, ratio, seed, budget, init)
        metrics = Path(plan.out_dir) / name / "metrics.json"
        if (info := self.reused(key, published(metrics, fp, self.log, f"cpt {key}"))) is not None:
            return info
        model, n_params, n_total = self.model(size, init)
        load_model(base, model)
        sch = plan.cpt_schedule
        opt = sch.optimizer(model, init_state=base / "optimizer.pt", lr=plan.lr_for(size, sch.lr))
        marks = [m // self.per_step for m in checkpoint_tokens(plan, budget)]
        points = [{"step": 0, "tokens": 0, **{f"loss_{k}": v for k, v in base_info["losses"].items()}}]
        trainer = Trainer(self.dp, model, opt, sch.scheduler(opt, marks[-1]),
                          self.batches(1 + int(round(ratio * 1000)), ratio, seed), token_mean_loss,
                          state=LMState(run_folder(out, name), fp), history=points, name=f"cpt {key}", log=self.log)
        saved_before = len(trainer.history) - 1                # checkpoints this launch resumed from
        for stop in marks:
            if stop <= trainer.step:
                continue
            trainer.train(stop)
            losses = trainer.evaluate(self.losses)
            pt = {"step": stop, "tokens": stop * self.per_step, **{f"loss_{k}": v for k, v in losses.items()}}
            trainer.history.append(pt)
            if self.dp.rank == 0:
                self.pipes.report_custom_message({"run": key, **pt})
                self.log(f"cpt {key} D={pt['tokens']}: loss_general={losses['general']:.4f} "
                         f"loss_domain={losses['domain']:.4f}")
            trainer.save()
            if stop < marks[-1]:
                crash_if_asked("CRUCIBLE_PROBE_CRASH_AFTER_CHECKPOINTS", len(trainer.history) - 1, "checkpoints",
                               f"cpt {key}", self.log, since=saved_before, kill=self.dp.kill_launch)
        info = {"fingerprint": fp, "key": key, "size": size, "ratio": ratio, "seed": seed, "init": init,
                "cpt_settings": {**plan.cpt_settings(), "cpt_tokens": points_budget(plan, budget)},
                "lr": plan.lr_for(size, sch.lr), "n_params": n_params, "n_params_total": n_total, "world_size": self.dp.world,
                "subdomain_share": self.manifest["subdomain_share"], "points": trainer.history,
                "wall_s": round(time.monotonic() - t0, 2)}
        if self.dp.rank == 0:
            write_json_atomic(info, metrics, indent=1)
        trainer.finish()                          # the run is finished; its result is the metrics
        return info


def run(plan: ProbePlan, out: Path, fingerprint: str, pipes) -> Optional[dict]:
    """Train (or reuse) every run of the plan in order; the result (rank 0) is ``{"world_size",
    "distributed_type", "phase", "runs": {key: base.json or metrics.json record}}``."""
    from ops.lm.model import quiet_transformers
    from ops.lm.train import DataParallel
    from ops.progress import Progress

    quiet_transformers()
    dp = DataParallel.start(plan.global_batch)
    manifest = json.loads((Path(plan.data_dir) / "manifest.json").read_text())
    costs = [run_cost(plan, r, manifest["vocab_size"]) for r in plan.runs]
    mode = choose_parallelism(costs, dp.world, plan.parallelism)
    mine = assign_runs(costs, dp.world)[dp.rank] if mode == "runs" else list(range(len(plan.runs)))
    worker = dp.solo() if mode == "runs" else dp
    probe = _Probe(plan, worker, pipes, manifest)
    pipes.log.info(f"probe {plan.phase}: world_size={dp.world} distributed_type={dp.acc.distributed_type} "
                   f"parallelism={mode} local_batch={worker.local_batch} "
                   f"runs={[plan.runs[i]['key'] for i in mine]}")
    dp.record(plan.out_dir if plan.phase == "cpt" else plan.base_dir)
    progress = Progress(len(mine), f"probe {plan.phase} (rank {dp.rank})", pipes.log.info, every_s=0.0, unit="runs")
    results = {}
    for i in mine:
        r = plan.runs[i]
        results[r["key"]] = (probe.base if plan.phase == "base" else probe.cpt)(r, out)
        progress.update()
    if mode == "runs":                          # every rank's records on every rank (also the barrier)
        results = dict(dp.gather(list(results.items())))
    return {**dp.describe(), "parallelism": mode, "phase": plan.phase, "runs": results} if dp.rank == 0 else None


def main(argv: Optional[list[str]] = None) -> int:
    return worker_main(ProbePlan.from_json, run, argv, description=__doc__)


if __name__ == "__main__":
    from ops.launch import exit_worker

    exit_worker(main())
