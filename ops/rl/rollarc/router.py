"""Hardware-affinity request routing between the LLM engine pools (RollArc, arXiv 2512.22560 §4,
hardware-affinity mapping; docs/rollarc.md, "Pools and the affinity router"). Pure Python: no ray, no torch.

RollArc sends compute-bound work to compute-optimised GPUs and bandwidth-bound work to
bandwidth-optimised GPUs. An LLM call has two phases:

* **prefill** processes the prompt's tokens in one pass (a large matrix-matrix product per layer):
  its time is set by peak FLOP/s;
* **decode** generates one token per step for every running sequence (continuous batching): each
  step reads all weights and the KV cache once, so its time is set by HBM bandwidth and barely
  depends on the batch size.

A request whose prompt is long relative to its response (late agentic turns: the history of tool
outputs and observations is re-read, the action is short) is *prefill-heavy* and goes to the
``gpu_compute`` pool; one with a long response (first turns: long reasoning) is *decode-heavy* and
goes to ``gpu_bandwidth``. Within a pool the engine with the fewest outstanding requests is chosen.

The router is a plain object called from one asyncio thread (no locks): ``route`` before sending a
request, ``done`` when its response (or error) is back. The expected decode length must be known
before generation; ``DecodeLengthEstimator`` keeps a running estimate per environment/turn kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping, Optional, Sequence

from .types import POOLS

#: The pools that host LLM engines (the others in ``types.POOLS`` run environments and verifiers).
ROUTED_POOLS = ("gpu_compute", "gpu_bandwidth")
POLICIES = ("affinity", "uniform")

#: Default classification threshold: prompt_tokens / expected_decode_tokens >= 4 is prefill-heavy.
#: Why 4: with the default profiles below, one prompt token costs 1 / 35,000 s of a compute GPU, one
#: decoded token of a sequence in a batch of B costs 1 / (140 x B) s; at a moderate batch (B ~ 60)
#: the two are equal when P / D = 250 / B ~ 4, so above it the request's engine time is mostly
#: prefill. In the agentic workload of ``sim/rollarc.py`` the first turn has P/D ~ 0.5-2.4 (5th-95th
#: percentile) and later turns ~ 6-36 with the default 90% prefix-cache hit (19-120 without), so any
#: threshold between ~3 and ~5 makes the same decisions there. It is also the knob that balances
#: the pools: a larger value sends less work to ``gpu_compute``.
DEFAULT_PREFILL_HEAVY_RATIO = 4.0


@dataclass(frozen=True)
class PoolProfile:
    """Speed of one engine of a pool (one GPU serving a 7B-class dense model in bf16).

    Raises:
        ValueError: a speed <= 0 or max_batch < 1 (named).
    """

    name: str
    """The pool (``gpu_compute`` | ``gpu_bandwidth``)."""
    prefill_tok_s: float
    """Prompt tokens per second of prefill (compute-bound), > 0."""
    decode_tok_s: float
    """Decode steps per second, i.e. tokens per second of *each* running sequence (> 0); a step costs
    1 / decode_tok_s seconds whatever the batch size up to max_batch (memory-bound: the weights are read once
    per step)."""
    max_batch: int
    """Concurrent sequences (continuous-batching slots; bounded by KV-cache memory), >= 1."""

    def __post_init__(self):
        if self.prefill_tok_s <= 0:
            raise ValueError(f"PoolProfile.prefill_tok_s must be > 0, got {self.prefill_tok_s}")
        if self.decode_tok_s <= 0:
            raise ValueError(f"PoolProfile.decode_tok_s must be > 0, got {self.decode_tok_s}")
        if self.max_batch < 1:
            raise ValueError(f"PoolProfile.max_batch must be >= 1, got {self.max_batch}")


# Default profiles, modelled on the H800 (compute-optimised) vs H20 (bandwidth-optimised) pair that
# RollArc's disaggregation targets. Vendor peaks: H800 SXM ~989 dense bf16 TFLOP/s, 3.35 TB/s HBM3,
# 80 GB; H20 ~148 TFLOP/s, 4.0 TB/s HBM3, 96 GB. So prefill (FLOP-bound) is ~6.7x faster on the
# H800, decode (bandwidth-bound) ~1.2x faster on the H20. Absolute numbers for a 7B model (14 GB of
# bf16 weights, 2 x 7e9 FLOP per prompt token): prefill at ~50% MFU -> 35,000 / 5,300 tok/s; decode
# at ~60% of peak bandwidth -> 3.35e12 x 0.6 / 14e9 ~ 140 and 4.0e12 x 0.6 / 14e9 ~ 170 steps/s;
# max_batch from the KV memory left after the weights (66 vs 82 GB at ~0.35 GB per sequence of ~6k
# tokens of Qwen2.5-7B's GQA cache). [open] The paper does not publish per-pool engine speeds.
H800_CLASS = PoolProfile("gpu_compute", prefill_tok_s=35_000.0, decode_tok_s=140.0, max_batch=192)
H20_CLASS = PoolProfile("gpu_bandwidth", prefill_tok_s=5_300.0, decode_tok_s=170.0, max_batch=240)
DEFAULT_PROFILES = {"gpu_compute": H800_CLASS, "gpu_bandwidth": H20_CLASS}


def estimate_decode_tokens(history: Sequence[float], default: float, alpha: float = 0.2) -> float:
    """Expected response length from past response lengths of the same kind of turn: an exponential
    moving average started at the first observation (the default never lingers in it).

    Args:
        history: past response lengths in tokens, oldest first (may be empty).
        default: returned when ``history`` is empty (use the request's max_new_tokens: the
            conservative guess, it classifies an unknown turn as decode-heavy).
        alpha: weight of the newest observation, in (0, 1].
    Returns: expected decode tokens (float).
    Raises:
        ValueError: alpha outside (0, 1], default < 0 or a negative length (named).
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if default < 0:
        raise ValueError(f"default must be >= 0, got {default}")
    est: Optional[float] = None
    for x in history:
        if x < 0:
            raise ValueError(f"history holds a negative length: {x}")
        est = float(x) if est is None else (1 - alpha) * est + alpha * float(x)
    return float(default) if est is None else est


class DecodeLengthEstimator:
    """Running ``estimate_decode_tokens`` per key, e.g. ``(env, "first" if turn == 0 else "later")``
    — the first turn of an agentic episode reasons at length, later ones emit short actions.

    Args: default_tokens: estimate for an unseen key (max_new_tokens); alpha: EMA weight in (0, 1].
    Raises: ValueError: alpha outside (0, 1], default_tokens < 0, or observing a negative length.
    """

    def __init__(self, default_tokens: float, alpha: float = 0.2):
        estimate_decode_tokens([], default_tokens, alpha)           # validates both
        self.default_tokens, self.alpha = float(default_tokens), alpha
        self._est: dict[Hashable, float] = {}
        self._n: dict[Hashable, int] = {}

    def estimate(self, key: Hashable) -> float:
        """Expected decode tokens for a turn of this kind."""
        return self._est.get(key, self.default_tokens)

    def observe(self, key: Hashable, tokens: float) -> None:
        """Fold in the length of a finished response of this kind."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        prev = self._est.get(key)
        self._est[key] = float(tokens) if prev is None else (1 - self.alpha) * prev + self.alpha * float(tokens)
        self._n[key] = self._n.get(key, 0) + 1

    def counts(self) -> dict:
        """Observations per key."""
        return dict(self._n)


class RequestRouter:
    """Chooses (pool, engine index) for each LLM request (RollArc §4, hardware-affinity mapping).

    Args:
        engines: pool -> number of engines, pools from ``ROUTED_POOLS``; a pool may have 0 engines
            but not all of them.
        policy: ``affinity``: a prefill-heavy request (prompt_tokens / max(1, expected_decode_tokens)
            >= prefill_heavy_ratio) prefers ``gpu_compute``, any other ``gpu_bandwidth``; if the
            preferred pool has no engine it falls back to the other. ``uniform``: ignore the shape,
            use every engine of both pools.
            Either way the engine is the one with the fewest outstanding requests (ties: fewest
            routed so far, then pool order, then index), so equal load spreads round-robin.
        prefill_heavy_ratio: the threshold above (> 0); default ``DEFAULT_PREFILL_HEAVY_RATIO``.
        spill_outstanding: affinity only, off by default. When set to k >= 1 and every engine of the
            preferred pool already has >= k outstanding requests while the other pool has an engine
            with fewer outstanding than the preferred pool's least-loaded one, the request spills
            there. Set k near the pool's max_batch: past it a request would queue on its preferred
            pool, and running on the less suited hardware beats waiting.
    Raises:
        ValueError: unknown policy, unknown pool in ``engines``, a negative count, no engine at all,
            or prefill_heavy_ratio <= 0 (named).
    """

    def __init__(self, engines: Mapping[str, int], policy: str = "affinity",
                 prefill_heavy_ratio: float = DEFAULT_PREFILL_HEAVY_RATIO, spill_outstanding: Optional[int] = None):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        for pool, n in engines.items():
            if pool not in ROUTED_POOLS:
                kind = "hosts no LLM engine" if pool in POOLS else "is not a pool"
                raise ValueError(f"engines: {pool!r} {kind}; routed pools are {ROUTED_POOLS}")
            if not isinstance(n, int) or n < 0:
                raise ValueError(f"engines[{pool!r}] must be an int >= 0, got {n!r}")
        if sum(engines.values()) == 0:
            raise ValueError(f"engines must hold at least one engine, got {dict(engines)}")
        if not prefill_heavy_ratio > 0:
            raise ValueError(f"prefill_heavy_ratio must be > 0, got {prefill_heavy_ratio}")
        if spill_outstanding is not None and spill_outstanding < 1:
            raise ValueError(f"spill_outstanding must be >= 1 or None, got {spill_outstanding}")
        self.policy, self.prefill_heavy_ratio = policy, float(prefill_heavy_ratio)
        self.spill_outstanding = spill_outstanding
        self.engines = {p: engines.get(p, 0) for p in ROUTED_POOLS}
        self._out = {p: [0] * n for p, n in self.engines.items()}           # outstanding per engine
        self._routed = {p: [0] * n for p, n in self.engines.items()}        # routed per engine
        self._tok = {p: {"prefill_tokens": 0, "decode_tokens": 0} for p in ROUTED_POOLS}
        self._counts = {"prefill_heavy": 0, "decode_heavy": 0, "spilled": 0, "fallback": 0}

    def is_prefill_heavy(self, prompt_tokens: float, expected_decode_tokens: float) -> bool:
        """The affinity classification: prompt_tokens / max(1, expected_decode_tokens) >= ratio."""
        return prompt_tokens / max(1.0, expected_decode_tokens) >= self.prefill_heavy_ratio

    def _best(self, pools: Sequence[str]) -> Optional[tuple[int, int, int, int]]:
        cands = [(self._out[p][i], self._routed[p][i], ROUTED_POOLS.index(p), i)
                 for p in pools for i in range(self.engines[p])]
        return min(cands) if cands else None

    def route(self, prompt_tokens: float, expected_decode_tokens: float) -> tuple[str, int]:
        """Pick the engine for one request and count it as outstanding there.

        Args:
            prompt_tokens: tokens to prefill (>= 0).
            expected_decode_tokens: expected response tokens (>= 0), e.g. from
                ``DecodeLengthEstimator``.
        Returns: (pool, engine_index), engine_index in [0, engines[pool]).
        Raises: ValueError: a negative token count (named).
        """
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {prompt_tokens}")
        if expected_decode_tokens < 0:
            raise ValueError(f"expected_decode_tokens must be >= 0, got {expected_decode_tokens}")
        heavy = self.is_prefill_heavy(prompt_tokens, expected_decode_tokens)
        self._counts["prefill_heavy" if heavy else "decode_heavy"] += 1
        if self.policy == "uniform":
            best = self._best(ROUTED_POOLS)
        else:
            want = "gpu_compute" if heavy else "gpu_bandwidth"
            other = "gpu_bandwidth" if heavy else "gpu_compute"
            best = self._best([want])
            if best is None:
                best = self._best([other])
                self._counts["fallback"] += 1
            elif self.spill_outstanding is not None and best[0] >= self.spill_outstanding:
                alt = self._best([other])
                if alt is not None and alt[0] < best[0]:
                    best = alt
                    self._counts["spilled"] += 1
        assert best is not None                                   # __init__ guarantees an engine
        pool, i = ROUTED_POOLS[best[2]], best[3]
        self._out[pool][i] += 1
        self._routed[pool][i] += 1
        self._tok[pool]["prefill_tokens"] += prompt_tokens
        self._tok[pool]["decode_tokens"] += expected_decode_tokens
        return pool, i

    def done(self, pool: str, engine_index: int) -> None:
        """Release one outstanding request of that engine (call once per ``route``, on success or
        failure).

        Raises: ValueError: unknown pool, engine_index out of range, or nothing outstanding there.
        """
        if pool not in self._out:
            raise ValueError(f"pool must be one of {ROUTED_POOLS}, got {pool!r}")
        if not 0 <= engine_index < self.engines[pool]:
            raise ValueError(f"engine_index must be in [0, {self.engines[pool]}) for {pool}, got {engine_index}")
        if self._out[pool][engine_index] == 0:
            raise ValueError(f"done({pool!r}, {engine_index}) without an outstanding request there")
        self._out[pool][engine_index] -= 1

    def outstanding(self, pool: str) -> list[int]:
        """Outstanding requests per engine of ``pool``."""
        if pool not in self._out:
            raise ValueError(f"pool must be one of {ROUTED_POOLS}, got {pool!r}")
        return list(self._out[pool])

    def stats(self) -> dict:
        """Counters: per pool ``engines``, ``routed``, ``prefill_tokens``, ``decode_tokens``
        (expected, as passed to ``route``), ``outstanding`` (now) and ``outstanding_per_engine``;
        top level ``policy``, ``prefill_heavy`` / ``decode_heavy`` (classified requests, whatever
        the policy), ``spilled`` and ``fallback`` (affinity requests not sent to their pool)."""
        pools = {p: {"engines": self.engines[p], "routed": sum(self._routed[p]), **self._tok[p],
                     "outstanding": sum(self._out[p]), "outstanding_per_engine": list(self._out[p])}
                 for p in ROUTED_POOLS}
        return {"policy": self.policy, "pools": pools, **self._counts}
