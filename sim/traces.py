"""Workload traces for the discrete-event simulator ``sim.des``: response lengths of single-turn
RL rollouts (RollPacker, arXiv 2509.21009) and per-turn token shapes and environment latencies of
multi-turn agentic episodes (RollArc, arXiv 2512.22560). See docs/rollpacker.md and docs/rollarc.md.

Every draw is keyed: a length or latency depends only on (seed, prompt/task uid, sample index,
turn), never on the order in which a simulated method asks for it, so every method of a comparison
faces exactly the same responses and environments.

* ``LogNormalLengths`` — the published statistic of RollPacker's workload is the shape of the tail
  (docs/rollpacker.md, paper anchors: the longest response is 25-32x the median). The law is
  log L = log(median) + sigma_prompt z_p + sigma_response z (z_p fixed per prompt: a hard prompt
  is long every time). [assumption] median 1,000 tokens, max 32,768, sigma 0.75 / 0.75, prompt
  lengths log-normal around 256 tokens: the paper publishes no length histogram; these defaults
  give max/median ~25-32 over a 1,024-response step (``tail_ratio`` measures it).
* ``MeasuredLengths`` — replays a measured trace JSON (schema below) instead.
* ``ScriptedLengths`` — fixed lengths per prompt (the schedulers' tests).
* ``AgenticTurns`` — token shapes of tool-use / ReAct-style episodes (task prompt, a long first
  reasoning turn, short later actions, observations re-sent as context; prefix cache on the
  history). [assumption] the RollArc paper publishes no per-turn token model; the defaults are the
  ones ``sim/rollarc.py`` uses.
* ``env_latency`` — environment step latency with the laws of ``ops.rl.rollarc.envs.EnvLatency``
  (low / medium / heavy, same mean; heavy = Pareto alpha 1.5, infinite variance).

Measured length trace JSON (``crucible.length_trace/1``)::

    {"schema": "crucible.length_trace/1", "source": "...",
     "prompts": [{"uid": "p0", "prompt_tokens": 180, "response_lengths": [812, 1403, ...]}, ...]}

A simulated prompt (by its uid) maps to a trace prompt drawn uniformly with replacement, seeded by
(seed, uid), so two simulated prompts may replay the same trace prompt; its responses are drawn with
replacement from that prompt's lengths, so per-prompt difficulty is kept.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Sequence

from ops.rl.rollarc.envs import LATENCY_KINDS, EnvLatency

from .rollarc import TurnShapes

LENGTH_TRACE_SCHEMA = "crucible.length_trace/1"


def keyed_rng(*parts) -> random.Random:
    """A ``random.Random`` seeded from the parts (sha256 of their repr): order-independent draws."""
    h = hashlib.sha256(repr(parts).encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


_NORMAL = NormalDist()


def keyed_uniform(*parts) -> float:
    """A uniform draw in (0, 1) from the parts (blake2b of their repr); cheaper than ``keyed_rng``."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(h, "big") + 0.5) / 2.0**64


def keyed_normal(*parts) -> float:
    """A standard normal draw keyed by the parts (inverse CDF of ``keyed_uniform``)."""
    return _NORMAL.inv_cdf(keyed_uniform(*parts))


@dataclass(frozen=True)
class LogNormalLaw:
    """The heavy-tailed response-length law of RollPacker's workload (module docstring):
    log L = log(median) + sigma_prompt z_p + sigma_response z, clipped to [min_len, max_len] tokens;
    z_p is the prompt's difficulty (fixed per prompt), z fresh for every response. The base of
    ``LogNormalLengths`` (keyed draws, ``sim.des``), which says where z_p and z come from."""

    median: float = 1000.0
    """Median response length (tokens, > 0 in ``LogNormalLengths``). [assumption] 1,000 (module docstring)."""
    sigma_prompt: float = 0.75
    """Log-normal sigma of the prompt difficulty z_p, fixed per prompt (>= 0). [assumption] 0.75."""
    sigma_response: float = 0.75
    """Log-normal sigma of the per-response spread z, fresh for every response (>= 0). [assumption] 0.75."""
    min_len: int = 16
    """Shortest response (tokens): lengths are clipped to [min_len, max_len], 1 <= min_len <= max_len."""
    max_len: int = 32768
    """Longest response (tokens), the clip's upper bound. [assumption] 32,768 (module docstring)."""

    def draw_lengths(self, z_prompt: float, rng: random.Random, n: int) -> list[int]:
        """``n`` lengths (tokens) of a prompt of difficulty ``z_prompt``, z drawn from ``rng.gauss``."""
        mu = math.log(self.median) + self.sigma_prompt * z_prompt
        return [int(min(self.max_len, max(self.min_len, round(math.exp(mu + self.sigma_response * rng.gauss(0, 1))))))
                for _ in range(n)]


@dataclass(frozen=True)
class LogNormalLengths(LogNormalLaw):
    """Heavy-tailed response lengths with per-prompt difficulty (module docstring), keyed draws; the
    length law's fields (median, sigmas, min_len, max_len; tokens) are ``LogNormalLaw``'s.

    Raises: ValueError: a non-positive median / length bound, min_len > max_len, negative sigma.
    """

    prompt_median: float = 256.0
    """Median prompt length (tokens, > 0; log-normal). [assumption] 256 (module docstring)."""
    prompt_sigma: float = 0.4
    """Log-normal sigma of the prompt lengths (>= 0); a prompt has at least 8 tokens."""
    seed: int = 0
    """Trace seed: every draw is keyed by (seed, prompt uid, draw), never by the order of requests."""

    def __post_init__(self):
        if not (self.median > 0 and self.prompt_median > 0 and 1 <= self.min_len <= self.max_len):
            raise ValueError(f"LogNormalLengths: need median > 0, prompt_median > 0, 1 <= min_len <= max_len; got {self}")
        if self.sigma_prompt < 0 or self.sigma_response < 0 or self.prompt_sigma < 0:
            raise ValueError(f"LogNormalLengths: sigmas must be >= 0, got {self}")

    def prompt_tokens(self, uid: str) -> int:
        z = keyed_normal("prompt_len", self.seed, uid)
        return max(8, round(math.exp(math.log(self.prompt_median) + self.prompt_sigma * z)))

    def lengths(self, uid: str, n: int, draw: int = 0) -> list[int]:
        """``n`` response lengths of prompt ``uid`` at its ``draw``-th rollout (a prompt rolled out
        again, e.g. in a long round, gets fresh responses but keeps its difficulty)."""
        return self.draw_lengths(keyed_normal("difficulty", self.seed, uid), keyed_rng("response", self.seed, uid, draw), n)

    def describe(self) -> dict:
        return {"kind": "lognormal", **asdict(self)}


@dataclass
class MeasuredLengths:
    """Replay of a measured length trace (``crucible.length_trace/1``, module docstring).

    Raises (``load``): FileNotFoundError; ValueError naming the file and field.
    """

    prompts: list
    """The trace's prompts as (uid, prompt_tokens, response_lengths) tuples (``load`` builds them)."""
    source: str = ""
    """The trace file it was loaded from."""
    seed: int = 0
    """Replay seed: picks each simulated prompt's trace row and its responses (keyed by uid and draw)."""
    max_len: int = 1 << 30
    """Longest response in the trace (tokens); ``load`` sets it (the default 2**30 bounds nothing)."""

    @classmethod
    def load(cls, path: str | Path, seed: int = 0) -> "MeasuredLengths":
        p = Path(path)
        d = json.loads(p.read_text(encoding="utf-8"))
        if d.get("schema") != LENGTH_TRACE_SCHEMA:
            raise ValueError(f"{p}: schema must be {LENGTH_TRACE_SCHEMA!r}, got {d.get('schema')!r}")
        rows = d.get("prompts")
        if not isinstance(rows, list) or not rows:
            raise ValueError(f"{p}: prompts must be a non-empty list")
        out = []
        for i, r in enumerate(rows):
            lens = r.get("response_lengths") if isinstance(r, dict) else None
            if not (isinstance(lens, list) and lens and all(isinstance(x, int) and x >= 1 for x in lens)):
                raise ValueError(f"{p}: prompts[{i}].response_lengths must be a non-empty list of ints >= 1")
            pt = r.get("prompt_tokens", 256)
            if not (isinstance(pt, int) and pt >= 1):
                raise ValueError(f"{p}: prompts[{i}].prompt_tokens must be an int >= 1, got {pt!r}")
            out.append((str(r.get("uid", i)), pt, list(lens)))
        return cls(out, str(p), seed, max(max(x[2]) for x in out))

    def _row(self, uid: str):
        n = len(self.prompts)
        return self.prompts[keyed_rng("map", self.seed, uid).randrange(n)]

    def prompt_tokens(self, uid: str) -> int:
        return self._row(uid)[1]

    def lengths(self, uid: str, n: int, draw: int = 0) -> list[int]:
        lens = self._row(uid)[2]
        rng = keyed_rng("replay", self.seed, uid, draw)
        return [lens[rng.randrange(len(lens))] for _ in range(n)]

    def describe(self) -> dict:
        return {"kind": "measured", "source": self.source, "prompts": len(self.prompts), "seed": self.seed}


@dataclass
class ScriptedLengths:
    """Fixed response lengths, for tests of the schedulers on ``sim.des.DESEngine``:
    ``by_prompt[uid][i]`` is the length (tokens) of sample i of that prompt at every rollout (samples
    beyond the list repeat its last value; ``default`` for a uid not listed); every prompt has
    ``prompt_len`` tokens.

    Raises: ValueError: a length, ``default`` or ``prompt_len`` below 1 (naming the prompt).
    """

    by_prompt: dict
    """uid -> response lengths (tokens, >= 1, non-empty)."""
    default: int = 1
    """Length of every sample of a prompt not in ``by_prompt`` (tokens, >= 1)."""
    prompt_len: int = 16
    """Prompt tokens of every prompt (>= 1)."""

    def __post_init__(self):
        for uid, lens in self.by_prompt.items():
            if not lens or any(int(x) < 1 for x in lens):
                raise ValueError(f"ScriptedLengths.by_prompt[{uid!r}] must be a non-empty list of lengths >= 1, got {lens!r}")
        if self.default < 1 or self.prompt_len < 1:
            raise ValueError(f"ScriptedLengths: default and prompt_len must be >= 1, got {self.default}, {self.prompt_len}")

    def prompt_tokens(self, uid: str) -> int:
        return self.prompt_len

    def lengths(self, uid: str, n: int, draw: int = 0) -> list[int]:
        got = list(self.by_prompt.get(uid) or [self.default])
        return [int(got[min(i, len(got) - 1)]) for i in range(n)]

    def describe(self) -> dict:
        return {"kind": "scripted", "prompts": len(self.by_prompt), "default": self.default,
                "prompt_len": self.prompt_len}


def tail_ratio(trace, n_prompts: int = 128, n: int = 8, steps: int = 20) -> dict:
    """longest / median response of a step of ``n_prompts x n`` responses (the statistic the
    RollPacker paper publishes: 25-32x), over ``steps`` steps of fresh prompts (one step's ratio
    varies a lot: it is a maximum): mean, min, max, and the mean median length."""
    ratios, meds = [], []
    for st in range(steps):
        lens = sorted(x for i in range(n_prompts) for x in trace.lengths(f"p{st * n_prompts + i}", n))
        med = lens[len(lens) // 2]
        ratios.append(lens[-1] / med)
        meds.append(med)
    return {"max_over_median_mean": sum(ratios) / steps, "max_over_median_min": min(ratios),
            "max_over_median_max": max(ratios), "median_tokens_mean": sum(meds) / steps, "steps": steps,
            "responses_per_step": n_prompts * n}


# ------------------------------------------------------------------------------------ agentic

@dataclass(frozen=True)
class Turn:
    """One LLM call of an episode, then the environment step after it."""

    context: int
    """Tokens in the prompt (the conversation so far)."""
    cached: int
    """Tokens of ``context`` in the engine's prefix cache; ``new`` = context - cached are prefilled."""
    decode: int
    """Tokens generated."""
    env_s: float
    """Seconds of the environment step after the call (capped at the turn timeout)."""
    timed_out: bool = False
    """The environment step exceeded the turn timeout (the episode ends ``timeout``)."""

    @property
    def new(self) -> int:
        return self.context - self.cached


@dataclass(frozen=True)
class AgenticTurns(TurnShapes):
    """Token shapes of a multi-turn episode (tokens) and the environment model. The token shapes
    (task_prompt_median ... prefix_cache_hit) are the routing ablation's (``sim.rollarc.TurnShapes``:
    one set of assumptions).
    """

    done_turns: tuple = (4, 12)
    """(lo, hi), 1 <= lo <= hi: the episode ends ``ok`` after U{lo..hi} turns; ``max_turns`` truncates it."""

    def __post_init__(self):
        if not 0 <= self.prefix_cache_hit <= 1:
            raise ValueError(f"AgenticTurns.prefix_cache_hit must be in [0, 1], got {self.prefix_cache_hit}")
        lo, hi = self.done_turns
        if not 1 <= lo <= hi:
            raise ValueError(f"AgenticTurns.done_turns must be (lo, hi) with 1 <= lo <= hi, got {self.done_turns}")

    def episode(self, seed: int, task: str, member: int, max_turns: int, env_kind: str, env_mean_s: float,
                turn_timeout_s: float) -> tuple[list[Turn], str]:
        """The turns of one trajectory (``member`` of the group of ``task``) and how it ends: at most
        ``max_turns`` turns; the list ends at the turn after which the episode is done (``ok``),
        truncated at ``max_turns`` (``truncated``) or its env step timed out (``timeout``). Keyed:
        the same for every method.

        Raises: ValueError: unknown env_kind, max_turns < 1.
        """
        if env_kind not in LATENCY_KINDS:
            raise ValueError(f"env latency kind must be one of {LATENCY_KINDS}, got {env_kind!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        rng = keyed_rng("episode", seed, task, member)
        lat = EnvLatency(env_kind, env_mean_s, seed=keyed_rng("env", seed, task, member).getrandbits(32))
        done_after = rng.randint(*self.done_turns)
        ctx = self.task_prompt(rng)
        cached = 0
        out = []
        status = "ok" if done_after <= max_turns else "truncated"
        for k in range(min(max_turns, done_after)):
            dec, obs = self.turn(rng, k)
            e = lat.sample()
            timed_out = e > turn_timeout_s
            out.append(Turn(ctx, cached, dec, min(e, turn_timeout_s), timed_out))
            if timed_out:
                status = "timeout"
                break
            cached = round(self.prefix_cache_hit * (ctx + dec))
            ctx += dec + obs
        return out, status

    def describe(self) -> dict:
        return asdict(self)


def success_probability(seed: int, task: str) -> float:
    """Per-task probability that an ``ok`` episode earns reward 1 (U(0.15, 0.85)); keyed."""
    return 0.15 + 0.7 * keyed_uniform("task_success", seed, task)


def reward_runtime(seed: int, uid: str, index: int, median_s: float, sigma: float, hang_fraction: float,
                   draw: int = 0) -> float:
    """Seconds a verifier runs on one response (inf for a response that hangs: an infinite loop in
    generated code). Per-prompt base time log-normal(median_s, sigma) times a per-response factor
    log-normal(0, 0.3); keyed."""
    if hang_fraction > 0 and keyed_uniform("hang", seed, uid, index, draw) < hang_fraction:
        return math.inf
    base = math.exp(math.log(median_s) + sigma * keyed_normal("reward_base", seed, uid))
    return base * math.exp(0.3 * keyed_normal("reward_resp", seed, uid, index, draw))


def quantiles(xs: Sequence[float], qs=(0.5, 0.99)) -> dict:
    s = sorted(xs)
    return {f"p{round(q * 100)}": s[min(len(s) - 1, int(q * len(s)))] for q in qs} if s else {}
