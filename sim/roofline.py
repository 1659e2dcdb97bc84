"""Roofline cost model of LLM inference and training steps, for the discrete-event simulator
(``sim.des``) of RollPacker (arXiv 2509.21009) and RollArc (arXiv 2512.22560); see
docs/rollpacker.md and docs/rollarc.md, section "Simulator".

Every cost is derived from public hardware peaks and the model's shape; nothing is fitted to a
paper's result. One engine *iteration* (a forward pass of a continuous-batching engine) runs
``a`` decoding sequences (one new token each, their contexts summing to ``S`` tokens) and, when it
admits requests, prefills their new tokens (chunked prefill: they share the pass). Its time is

    t = f x ( max(FLOPs / (peak x compute_efficiency x tp), bytes / (hbm x bandwidth_efficiency x tp))
              + step_overhead_s + tp_comm )

    FLOPs = 2 N_body (a + n_new) + 2 V h (a + n_req) + 4 L H d (S + attention pairs of the prefill)
    bytes = weight bytes read per pass + KV bytes (S + a + prefill context read + n_new written)

with N_body the matrix parameters of the transformer blocks, V h the LM head (logits only for the
last position of a prefilled request), L layers, H query heads of size d, and ``f`` = 1 unless a
GPU calibration is loaded (below). So decode at small batch is bandwidth-bound (every step reads
all weights and the batch's KV cache) and prefill is compute-bound. A pure prefill of ``b`` prompts
of ``c`` tokens is the iteration with a = 0; a pure decode step is the one without admissions.

Training an optimizer step over sequences of lengths n_i costs
``(6 + 2 e) x params x sum(n_i) + (3 + e) x 2 L H d x sum(n_i^2)`` FLOPs (forward + backward of the
dense part, the causal attention term, and ``e`` extra forward passes: the old-log-probability
recompute of GRPO/PPO, default 1), at ``train_mfu`` of the peak.

Calibration: when ``benchmarks/results/gpu_calibration.json`` (written by
``benchmarks/gpu_calibration.py``) holds measurements for the model on the profile's device, the
measured step times override the roofline: ``f`` = measured / roofline, interpolated linearly in
(log2 batch, log2 context) over the measured grid (nearest measured point outside it), so at a
measured point the model returns the measured time and between points it follows the roofline's
shape. Prefill-dominated iterations use the prefill table, the others the decode table. It applies
only to tensor-parallel degree 1 (what the script measures).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
#: Where ``benchmarks/gpu_calibration.py`` writes and ``Roofline`` looks by default.
CALIBRATION_PATH = ROOT / "benchmarks" / "results" / "gpu_calibration.json"
CALIBRATION_SCHEMA = "crucible.gpu_calibration/1"


@dataclass(frozen=True)
class HardwareProfile:
    """One GPU: vendor peaks plus the efficiency factors a real engine reaches.

    The efficiency factors are parameters, the same for every profile, not tuned to any result;
    a GPU calibration replaces them by measurement.
    """

    name: str
    """Profile id (``h800``, ``h20``, ``h200``, ``cpu-tiny``)."""
    peak_flops: float
    """Dense BF16 tensor FLOP/s (> 0; vendor sheets quote 2:4-sparse figures, twice these)."""
    hbm_bytes_s: float
    """HBM bandwidth (bytes/s, > 0)."""
    hbm_bytes: float
    """HBM capacity (bytes, > 0)."""
    link_bytes_s: float
    """NVLink bandwidth per GPU (bytes/s as the sheet quotes it, > 0), for tensor parallelism and the
    colocated weight reshard."""
    compute_efficiency: float = 0.5
    """Fraction of ``peak_flops`` inference GEMMs reach, in (0, 1]. [assumption] 0.5."""
    bandwidth_efficiency: float = 0.7
    """Fraction of ``hbm_bytes_s`` a decode step reaches (memory-bandwidth utilisation), in (0, 1].
    [assumption] 0.7."""
    train_mfu: float = 0.4
    """Model-FLOP utilisation of a training step, in (0, 1]. 0.4: the Llama 3 report (arXiv 2407.21783,
    Table 4) gives 38-43% BF16 MFU on H100s; RL trainers with variable-length sequences usually reach
    less, so this is on the optimistic side."""
    step_overhead_s: float = 3e-3
    """Fixed CPU-side cost of one engine iteration (s, >= 0: scheduling, sampling, kernel launches; CUDA
    graphs keep it at a few ms). [assumption] 3 ms."""
    memory_utilization: float = 0.9
    """Share of HBM the engine may use, in (0, 1] (vLLM's ``gpu_memory_utilization`` default, 0.9); the
    KV cache gets what the weights leave of it."""
    allreduce_latency_s: float = 1e-5
    """Latency of one tensor-parallel all-reduce (s, >= 0). [assumption] 10 us."""

    def __post_init__(self):
        for f in ("peak_flops", "hbm_bytes_s", "hbm_bytes", "link_bytes_s"):
            if not getattr(self, f) > 0:
                raise ValueError(f"HardwareProfile({self.name}).{f} must be > 0, got {getattr(self, f)!r}")
        for f in ("compute_efficiency", "bandwidth_efficiency", "train_mfu", "memory_utilization"):
            if not 0 < getattr(self, f) <= 1:
                raise ValueError(f"HardwareProfile({self.name}).{f} must be in (0, 1], got {getattr(self, f)!r}")
        if self.step_overhead_s < 0 or self.allreduce_latency_s < 0:
            raise ValueError(f"HardwareProfile({self.name}): step_overhead_s and allreduce_latency_s must be >= 0")


#: NVIDIA H800 SXM5 (the compute-optimised GPU of both papers' clusters). NVIDIA H800 Tensor Core GPU
#: datasheet: BF16 tensor 1,979 TFLOP/s with sparsity (989.5 dense), 80 GB HBM3 at 3.35 TB/s,
#: NVLink 400 GB/s.
H800 = HardwareProfile("h800", peak_flops=989.5e12, hbm_bytes_s=3.35e12, hbm_bytes=80e9, link_bytes_s=400e9)
#: NVIDIA H20 (bandwidth-optimised, RollArc's decode pool). NVIDIA's H20 specification as published by
#: its OEM partners: BF16/FP16 148 TFLOP/s dense, 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s.
H20 = HardwareProfile("h20", peak_flops=148e12, hbm_bytes_s=4.0e12, hbm_bytes=96e9, link_bytes_s=900e9)
#: NVIDIA H200 SXM (the GPU a calibration is likely measured on). NVIDIA H200 Tensor Core GPU datasheet:
#: BF16 tensor 1,979 TFLOP/s with sparsity (989.5 dense), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s.
H200 = HardwareProfile("h200", peak_flops=989.5e12, hbm_bytes_s=4.8e12, hbm_bytes=141e9, link_bytes_s=900e9)
#: A CPU stand-in for ``gpu_calibration.py --tiny`` (tests only; not a vendor figure).
CPU_TINY = HardwareProfile("cpu-tiny", peak_flops=1e11, hbm_bytes_s=2e10, hbm_bytes=8e9, link_bytes_s=1e10)
PROFILES: dict[str, HardwareProfile] = {p.name: p for p in (H800, H20, H200, CPU_TINY)}


def profile_for_device(device_name: str) -> str:
    """The profile id for a ``torch.cuda.get_device_name()`` string (``h800``, ``h20``, ``h200``), else
    the lower-cased name with spaces as dashes (a profile the simulator does not know)."""
    n = device_name.lower()
    for key in ("h800", "h200", "h20"):
        if key in n:
            return key
    return "-".join(n.split())


@dataclass(frozen=True)
class ModelConfig:
    """A dense decoder-only transformer (Qwen2 / Llama layout: GQA attention, SwiGLU MLP, RMSNorm).

    Raises: ValueError: a non-positive size, or hidden not a multiple of heads, or heads of kv_heads.
    """

    name: str
    """Model id (``MODELS`` key, e.g. ``qwen2.5-7b``); calibration tables are keyed by it."""
    layers: int
    """Transformer blocks (positive int)."""
    hidden: int
    """Hidden size (positive int, a multiple of heads)."""
    heads: int
    """Query heads (positive int, a multiple of kv_heads); head_dim = hidden / heads."""
    kv_heads: int
    """Key/value heads of GQA attention (positive int)."""
    intermediate: int
    """MLP width of the SwiGLU block (positive int)."""
    vocab: int
    """Vocabulary size (positive int): rows of the embedding and of the LM head."""
    tie_embeddings: bool = False
    """The LM head shares the input embedding."""
    qkv_bias: bool = True
    """The q/k/v projections have biases (Qwen2)."""
    bytes_per_param: int = 2
    """Bytes per parameter (positive int; 2 = bf16), also used for the KV cache."""

    def __post_init__(self):
        for f in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "bytes_per_param"):
            if not (isinstance(getattr(self, f), int) and getattr(self, f) > 0):
                raise ValueError(f"ModelConfig({self.name}).{f} must be a positive int, got {getattr(self, f)!r}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"ModelConfig({self.name}): hidden ({self.hidden}) must be a multiple of heads "
                             f"({self.heads}) and heads of kv_heads ({self.kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        """Parameters of one block: q, k, v, o projections (+ q/k/v biases), the SwiGLU MLP, 2 norms."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * h + 2 * h * kv + h * h + ((h + 2 * kv) if self.qkv_bias else 0)
        return attn + 3 * h * self.intermediate + 2 * h

    @property
    def params(self) -> int:
        """All parameters: blocks, embedding, final norm and (untied) LM head."""
        emb = self.vocab * self.hidden
        return self.layers * self.layer_params + emb + self.hidden + (0 if self.tie_embeddings else emb)

    @property
    def body_matmul_params(self) -> int:
        """Parameters every token multiplies by in the blocks (biases and norms included)."""
        return self.layers * self.layer_params

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one forward pass reads: the blocks and the LM head (the embedding table
        of an untied model is only gathered, a few rows)."""
        return self.bytes_per_param * (self.body_matmul_params + self.head_params + self.hidden)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token of context: K and V, every layer, every KV head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs of one (query token, key token) pair over all layers and heads: QK^T and AV."""
        return 4 * self.layers * self.heads * self.head_dim

    def to_dict(self) -> dict:
        return {**asdict(self), "params": self.params, "weight_bytes": self.weight_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token}


# Shapes of the Qwen2.5 models (Qwen2.5 technical report, arXiv 2412.15115, Table 1, and the
# config.json of each Hugging Face checkpoint): the 0.5B / 1.5B / 7B classes.
QWEN25_0_5B = ModelConfig("qwen2.5-0.5b", layers=24, hidden=896, heads=14, kv_heads=2, intermediate=4864,
                          vocab=151936, tie_embeddings=True)
QWEN25_1_5B = ModelConfig("qwen2.5-1.5b", layers=28, hidden=1536, heads=12, kv_heads=2, intermediate=8960,
                          vocab=151936, tie_embeddings=True)
QWEN25_7B = ModelConfig("qwen2.5-7b", layers=28, hidden=3584, heads=28, kv_heads=4, intermediate=18944,
                        vocab=152064, tie_embeddings=False)
#: For ``gpu_calibration.py --tiny`` and the tests.
TINY = ModelConfig("tiny", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=512, tie_embeddings=True)
MODELS: dict[str, ModelConfig] = {m.name: m for m in (QWEN25_0_5B, QWEN25_1_5B, QWEN25_7B, TINY)}


def _lookup(table: Mapping[str, object], name: str, what: str):
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; known: {sorted(table)}")
    return table[name]


def get_profile(name: str) -> HardwareProfile:
    """Raises ValueError naming the known profiles."""
    return _lookup(PROFILES, name, "hardware profile")


def get_model(name: str) -> ModelConfig:
    """Raises ValueError naming the known models."""
    return _lookup(MODELS, name, "model config")


# ------------------------------------------------------------------------------------ calibration

@dataclass
class Calibration:
    """Measured step times from ``benchmarks/gpu_calibration.py``."""

    profile: str
    """The hardware profile id the measurements stand for (``device.profile``)."""
    tables: dict
    """{model name: {"prefill" | "decode": [(batch, context, seconds), ...]}}; a prefill point is
    ``batch`` prompts of ``context`` tokens each, a decode point one step of ``batch`` sequences each
    holding ``context`` tokens of KV cache."""
    source: str = ""
    """The file it came from."""
    _interp: dict = field(default_factory=dict, repr=False)
    """Cache of ``factor``: the interpolators per (model, kind), built on first use (internal)."""

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        """Read and validate a calibration JSON.

        Raises: FileNotFoundError; ValueError naming the file and the bad field (schema, device.profile,
            models.<m>.<kind>[i].batch/context/seconds).
        """
        p = Path(path)
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not valid JSON: {e}") from None
        if d.get("schema") != CALIBRATION_SCHEMA:
            raise ValueError(f"{p}: schema must be {CALIBRATION_SCHEMA!r}, got {d.get('schema')!r}")
        prof = (d.get("device") or {}).get("profile")
        if not isinstance(prof, str) or not prof:
            raise ValueError(f"{p}: device.profile must be a non-empty string, got {prof!r}")
        tables: dict = {}
        for m, md in (d.get("models") or {}).items():
            for kind in ("prefill", "decode"):
                pts = []
                for i, row in enumerate(md.get(kind) or []):
                    for k in ("batch", "context", "seconds"):
                        v = row.get(k) if isinstance(row, dict) else None
                        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                            raise ValueError(f"{p}: models.{m}.{kind}[{i}].{k} must be a number > 0, got {v!r}")
                    pts.append((float(row["batch"]), float(row["context"]), float(row["seconds"])))
                if pts:
                    tables.setdefault(m, {})[kind] = pts
        if not tables:
            raise ValueError(f"{p}: no measured points under models.<name>.prefill/decode")
        return cls(prof, tables, str(p))

    def has(self, model: str, kind: str) -> bool:
        return kind in self.tables.get(model, {})

    def factor(self, model: str, kind: str, batch: float, context: float, roofline_at) -> float:
        """measured / roofline, interpolated at (batch, context); ``roofline_at(b, c)`` gives the
        uncalibrated model at a measured point. 1.0 when nothing is measured for (model, kind)."""
        key = (model, kind)
        if key not in self._interp:
            pts = self.tables.get(model, {}).get(kind)
            if not pts:
                self._interp[key] = None
            else:
                import numpy as np
                from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

                xy = np.array([[math.log2(b), math.log2(c)] for b, c, _ in pts])
                r = np.array([s / roofline_at(b, c) for b, c, s in pts])
                near = NearestNDInterpolator(xy, r)
                lin = None
                if len(pts) >= 3 and np.linalg.matrix_rank(xy - xy.mean(0)) == 2:
                    lin = LinearNDInterpolator(xy, r)
                self._interp[key] = (lin, near, {})
        got = self._interp[key]
        if got is None:
            return 1.0
        lin, near, cache = got
        ck = (round(math.log2(max(batch, 1.0)) * 16), round(math.log2(max(context, 1.0)) * 16))
        if ck not in cache:
            x = (ck[0] / 16, ck[1] / 16)
            v = float(lin(*x)) if lin is not None else float("nan")
            cache[ck] = v if math.isfinite(v) else float(near(*x))
        return cache[ck]


def load_default_calibration(path: str | Path = CALIBRATION_PATH) -> Optional[Calibration]:
    """The calibration at ``path`` when the file exists, else None (a malformed file raises)."""
    return Calibration.load(path) if Path(path).exists() else None


# ------------------------------------------------------------------------------------- the model

@dataclass
class Roofline:
    """Step times of ``model`` served / trained on ``hw`` (one engine instance = ``tp`` GPUs).

    Raises: ValueError: tp < 1 or extra_forwards < 0.
    """

    hw: HardwareProfile
    """The GPU (``HardwareProfile``)."""
    model: ModelConfig
    """The served / trained model (``ModelConfig``)."""
    tp: int = 1
    """Tensor-parallel degree of an inference instance (int >= 1)."""
    calibration: Optional[Calibration] = None
    """Measured tables; used when its profile is ``hw.name``, it holds ``model`` and tp == 1
    (``calibrated`` says whether it is in use)."""
    extra_forwards: int = 1
    """Forward-only passes per training step besides forward + backward (>= 0; GRPO's
    old-log-probability recompute; 1)."""

    def __post_init__(self):
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise ValueError(f"Roofline.tp must be an int >= 1, got {self.tp!r}")
        if self.extra_forwards < 0:
            raise ValueError(f"Roofline.extra_forwards must be >= 0, got {self.extra_forwards}")
        c = self.calibration
        self.calibrated = bool(c is not None and c.profile == self.hw.name and self.tp == 1
                               and self.model.name in c.tables)
        m, hw = self.model, self.hw
        self._fpk = hw.peak_flops * hw.compute_efficiency * self.tp
        self._bpk = hw.hbm_bytes_s * hw.bandwidth_efficiency * self.tp
        self._body2 = 2.0 * m.body_matmul_params
        self._head2 = 2.0 * m.head_params
        self._attn = float(m.attn_flops_per_pair)
        self._kvb = float(m.kv_bytes_per_token)
        self._w = float(m.weight_bytes)

    # -- pieces
    def _comm_s(self, tokens: float) -> float:
        """Tensor-parallel all-reduces of one pass: 2 per layer of tokens x hidden bf16 (ring)."""
        if self.tp == 1:
            return 0.0
        m = self.model
        b = tokens * m.hidden * m.bytes_per_param * 2 * (self.tp - 1) / self.tp
        return 2 * m.layers * (self.hw.allreduce_latency_s + b / self.hw.link_bytes_s)

    def raw_iteration_s(self, decode_batch: int = 0, decode_context: float = 0.0,
                        prefill: Sequence[tuple[float, float]] = ()) -> float:
        """Uncalibrated time of one iteration: ``decode_batch`` sequences whose contexts sum to
        ``decode_context`` tokens each decode one token; ``prefill`` lists (new tokens, context
        already cached) of the requests admitted in this pass. Seconds."""
        n_new = sum(n for n, _ in prefill)
        pairs = sum(n * c + n * (n + 1) / 2 for n, c in prefill)
        kv_read = sum(c for _, c in prefill)
        a = decode_batch
        flops = self._body2 * (a + n_new) + self._head2 * (a + len(prefill)) + self._attn * (decode_context + pairs)
        byts = self._w + self._kvb * (decode_context + a + kv_read + n_new)
        return max(flops / self._fpk, byts / self._bpk) + self.hw.step_overhead_s + self._comm_s(a + n_new)

    def _factor(self, kind: str, batch: float, context: float) -> float:
        if not self.calibrated:
            return 1.0
        if kind == "prefill":
            ref = lambda b, c: self.raw_iteration_s(0, 0.0, [(c, 0.0)] * int(round(b)))  # noqa: E731
        else:
            ref = lambda b, c: self.raw_iteration_s(int(round(b)), b * c)  # noqa: E731
        return self.calibration.factor(self.model.name, kind, batch, context, ref)

    # -- public costs
    def iteration_s(self, decode_batch: int = 0, decode_context: float = 0.0,
                    prefill: Sequence[tuple[float, float]] = ()) -> float:
        """Time of one engine iteration (see the module docstring), calibrated when a calibration
        applies. Seconds."""
        raw = self.raw_iteration_s(decode_batch, decode_context, prefill)
        n_new = sum(n for n, _ in prefill)
        if prefill and n_new >= decode_batch:
            f = self._factor("prefill", len(prefill), n_new / len(prefill))
        elif decode_batch:
            f = self._factor("decode", decode_batch, decode_context / decode_batch)
        else:
            f = 1.0
        return raw * f

    def prefill_s(self, batch: int, tokens: int, cached: int = 0) -> float:
        """``batch`` prompts of ``tokens`` new tokens each (after ``cached`` tokens of prefix). Seconds."""
        return self.iteration_s(0, 0.0, [(tokens, cached)] * batch)

    def decode_step_s(self, batch: int, context: float) -> float:
        """One decode step of ``batch`` sequences each holding ``context`` tokens. Seconds."""
        return self.iteration_s(batch, batch * context)

    def decode_run(self, batch: int, context_sum: float) -> "DecodeRun":
        """Closed-form cost of consecutive decode steps of a fixed batch whose context sum grows by
        ``batch`` per step (see ``DecodeRun``)."""
        a = batch
        p1 = (self._body2 * a + self._head2 * a + self._attn * context_sum) / self._fpk
        q1 = self._attn * a / self._fpk
        p2 = (self._w + self._kvb * (context_sum + a)) / self._bpk
        q2 = self._kvb * a / self._bpk
        o = self.hw.step_overhead_s + self._comm_s(a)
        f = self._factor("decode", a, context_sum / a) if a else 1.0
        return DecodeRun(p1, q1, p2, q2, o, f)

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache an instance holds: usable HBM of ``tp`` GPUs minus the weights.
        Raises ValueError when the weights do not fit."""
        free = self.hw.hbm_bytes * self.hw.memory_utilization * self.tp - self.model.bytes_per_param * self.model.params
        if free <= 0:
            raise ValueError(f"{self.model.name} ({self.model.params / 1e9:.1f}B params) does not fit on "
                             f"{self.tp} x {self.hw.name}")
        return int(free // self.model.kv_bytes_per_token)

    def train_flops(self, seq_lens: Sequence[int]) -> float:
        """FLOPs of one optimizer step over sequences of these lengths (module docstring)."""
        e = self.extra_forwards
        m = self.model
        s1 = float(sum(seq_lens))
        s2 = float(sum(n * n for n in seq_lens))
        return (6 + 2 * e) * m.params * s1 + (3 + e) * 2 * m.layers * m.heads * m.head_dim * s2

    def train_gpu_s(self, seq_lens: Sequence[int]) -> float:
        """GPU-seconds of that step at ``train_mfu`` (divide by the trainer's GPUs for its time)."""
        return self.train_flops(seq_lens) / (self.hw.peak_flops * self.hw.train_mfu)

    def weight_sync_s(self, link_bytes_s: float, fixed_s: float) -> float:
        """Seconds to move the bf16 weights over a link of ``link_bytes_s``, plus ``fixed_s``."""
        return fixed_s + self.model.bytes_per_param * self.model.params / link_bytes_s

    def describe(self) -> dict:
        return {"hardware": asdict(self.hw), "model": self.model.to_dict(), "tp": self.tp,
                "calibrated": self.calibrated,
                "calibration_source": self.calibration.source if self.calibrated else None,
                "kv_capacity_tokens": self.kv_capacity_tokens()}


@dataclass(frozen=True)
class DecodeRun:
    """Step j (0-based) of a decode run lasts ``f * (max(p1 + q1 j, p2 + q2 j) + o)`` seconds: the
    compute and the bandwidth line of the roofline, both linear in the growing context."""

    p1: float
    """Compute line at step 0 (s): the first step's FLOPs / (peak x compute_efficiency x tp)."""
    q1: float
    """Compute line's growth per step (s): attention FLOPs of ``batch`` more context tokens."""
    p2: float
    """Bandwidth line at step 0 (s): first step's weight + KV bytes / (HBM x bandwidth_efficiency x tp)."""
    q2: float
    """Bandwidth line's growth per step (s): KV bytes of ``batch`` more context tokens."""
    o: float
    """Per-step constant (s): the iteration's step_overhead_s plus the tensor-parallel all-reduces."""
    f: float = 1.0
    """GPU calibration factor, measured / roofline (1.0: uncalibrated)."""

    def step_s(self, j: int) -> float:
        return self.f * (max(self.p1 + self.q1 * j, self.p2 + self.q2 * j) + self.o)

    def cum_s(self, n: int) -> float:
        """Seconds of the first ``n`` steps (exact, O(1))."""
        if n <= 0:
            return 0.0

        def lin(p: float, q: float, lo: int, hi: int) -> float:      # sum_{j=lo}^{hi-1} (p + q j)
            k = hi - lo
            return k * p + q * (lo + hi - 1) * k / 2 if k > 0 else 0.0

        dp, dq = self.p1 - self.p2, self.q1 - self.q2
        if dq == 0:
            tot = lin(self.p1, self.q1, 0, n) if dp >= 0 else lin(self.p2, self.q2, 0, n)
        else:
            # line 1 >= line 2 for j >= x (dq > 0) or j <= x (dq < 0), x the crossing
            x = -dp / dq
            c = min(n, max(0, math.ceil(x - 1e-12)))
            if dq > 0:
                tot = lin(self.p2, self.q2, 0, c) + lin(self.p1, self.q1, c, n)
            else:
                c = min(n, max(0, math.floor(x + 1e-12) + 1))
                tot = lin(self.p1, self.q1, 0, c) + lin(self.p2, self.q2, c, n)
        return self.f * (tot + n * self.o)

    def _segments(self, n: int):
        """[(start, end, p, q)]: the step ranges where one line of the roofline is the max."""
        dp, dq = self.p1 - self.p2, self.q1 - self.q2
        if dq == 0:
            return [(0, n, self.p1, self.q1) if dp >= 0 else (0, n, self.p2, self.q2)]
        x = -dp / dq
        if dq > 0:
            c = min(n, max(0, math.ceil(x - 1e-12)))
            return [(0, c, self.p2, self.q2), (c, n, self.p1, self.q1)]
        c = min(n, max(0, math.floor(x + 1e-12) + 1))
        return [(0, c, self.p1, self.q1), (c, n, self.p2, self.q2)]

    def steps_by(self, elapsed_s: float, n_max: int) -> int:
        """The fewest steps n <= n_max with cum_s(n) >= elapsed_s (the boundary at or after it):
        solved per segment from the quadratic, then checked against ``cum_s``."""
        if elapsed_s <= 1e-12 or n_max <= 0:
            return 0
        if self.cum_s(n_max) < elapsed_s - 1e-12:
            return n_max
        target = elapsed_s / self.f
        n = n_max
        acc = 0.0
        for lo, hi, p, q in self._segments(n_max):
            if hi <= lo:
                continue
            a0 = p + self.o + q * lo                       # first step of the segment
            seg = (hi - lo) * a0 + q * (hi - lo) * (hi - lo - 1) / 2
            if acc + seg >= target:
                t = target - acc                           # q/2 m^2 + (a0 - q/2) m = t
                b = a0 - q / 2
                m = t / b if q == 0 else (-b + math.sqrt(b * b + 2 * q * t)) / q
                n = min(hi, lo + max(0, math.ceil(m - 1e-9)))
                break
            acc += seg
        while n > 0 and self.cum_s(n - 1) >= elapsed_s - 1e-12:
            n -= 1
        while n < n_max and self.cum_s(n) < elapsed_s - 1e-12:
            n += 1
        return n

    def done_by(self, elapsed_s: float, n_max: int) -> int:
        """Steps completed within ``elapsed_s`` (the most n <= n_max with cum_s(n) <= elapsed_s)."""
        n = self.steps_by(elapsed_s, n_max)
        return n if self.cum_s(n) <= elapsed_s + 1e-12 else n - 1


def with_efficiency(hw: HardwareProfile, **kw) -> HardwareProfile:
    """A copy of ``hw`` with some factors changed (sensitivity runs)."""
    return replace(hw, **kw)


def profiles_table(names: Mapping[str, HardwareProfile] = PROFILES) -> dict:
    """The hardware profiles as plain dicts (name -> fields), for a results JSON."""
    return {k: asdict(v) for k, v in names.items()}
