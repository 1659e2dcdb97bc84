"""Rollout engines behind one interface, and a hard wall-clock guard around any engine call.

``Engine.generate(prompts, n, max_new_tokens, stop, timeout_s, on_finish) -> RolloutBatch``:
``prompts`` x ``n`` sampled responses, each with its tokens, per-token log-probabilities, finish
reason (``stop`` | ``length`` | ``timeout`` | ``abort``), the policy version that produced it and its
finish time. ``on_finish`` sees every response as it finishes and may abort the rest (tail batching).

Backends:
* ``HFEngine`` (CPU, the embedded default): transformers ``generate`` on a static batch with a
  stopping criterion that records each sequence's end, calls ``on_finish``, enforces the wall-clock
  deadline and ends the whole batch on abort; a final logits processor applies the sampling
  distribution (temperature, top-k, top-p: ``ops.lm.sampling``) and records the log-probabilities
  of exactly the distribution that was sampled — the trainer scores with the same function.
* ``VLLMEngine`` (GPU, optional extra): imported only when selected.
* ``sim.des.DESEngine`` (outside ``ops``; benchmarks and tests only): simulated time, for paper-scale runs.

``guarded_generate`` bounds any call (an engine that stalls inside one forward pass cannot check its
own deadline): past the hard limit the call is abandoned and every response not yet delivered is
returned as ``timeout`` (case ``rollout-never-ends``).
"""

from __future__ import annotations

import threading
import time
from typing import Optional, Protocol, Sequence

from ops.lm.sampling import SamplingConfig, warp_logits
from .types import Completion, OnFinish, Prompt, RolloutBatch



def model_device(model):
    """The device of a torch module's first parameter (cpu for a module without parameters)."""
    import torch

    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")

class Engine(Protocol):
    """What schedulers need from a rollout engine. ``version`` is the published policy version the
    engine holds (None while a weight sync is incomplete: it must not generate then)."""

    version: Optional[int]

    def generate(self, prompts: Sequence[Prompt], n: int, max_new_tokens: int, stop: Optional[list] = None,
                 timeout_s: float = 60.0, on_finish: Optional[OnFinish] = None) -> RolloutBatch: ...


class EngineNotReady(RuntimeError):
    """The engine holds no complete policy version (a weight sync is in progress or failed)."""


def _check_args(n: int, max_new_tokens: int, timeout_s: float) -> None:
    if n < 1:
        raise ValueError(f"generate.n must be >= 1, got {n}")
    if max_new_tokens < 1:
        raise ValueError(f"generate.max_new_tokens must be >= 1, got {max_new_tokens}")
    if not timeout_s > 0:
        raise ValueError(f"generate.timeout_s must be > 0, got {timeout_s}")


class HFEngine:
    """transformers ``generate`` on CPU (or any torch device), static batch, sampling.

    Args:
        model: a causal LM (``PreTrainedModel``), in eval mode.
        tokenizer: its tokenizer (pad and eos ids are taken from it).
        temperature, top_k, top_p: the sampling distribution (``ops.lm.sampling.SamplingConfig``:
            T > 0, top_k 0 = off, top_p in (0, 1], 1.0 = off); or pass ``sampling`` instead.
            The recorded log-probabilities are those of this (renormalised) distribution.
        version: the policy version of the weights the model holds.
        sampling: a SamplingConfig (overrides temperature/top_k/top_p).
    Attributes:
        sampling: the SamplingConfig the engine samples with (give it to the trainer).
        stale_syncs_refused, failed_syncs: weight-sync counters (``ops.rl.weights.sync_stats``).
    Raises:
        ValueError: a sampling setting out of range (names ``sampling.<field>``).
    """

    def __init__(self, model, tokenizer, temperature: float = 1.0, version: Optional[int] = 0, top_k: int = 0,
                 top_p: float = 1.0, sampling: Optional[SamplingConfig] = None):
        self.sampling = sampling if sampling is not None else SamplingConfig(temperature, top_k, top_p)
        self.model, self.tokenizer = model, tokenizer
        self.version = version
        self.stale_syncs_refused = 0
        self.failed_syncs = 0
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self._abort = threading.Event()
        self.lock = threading.Lock()                    # one generate at a time; weight sync takes it too

    @classmethod
    def from_spec(cls, model, tokenizer, spec: dict, version: Optional[int] = 0) -> "HFEngine":
        """An engine sampling with ``SamplingConfig.from_spec(spec)`` — the actor spec the trainer
        reads its sampling distribution from too (``ops.rl.ray_actors``)."""
        return cls(model, tokenizer, version=version, sampling=SamplingConfig.from_spec(spec))

    @property
    def temperature(self) -> float:
        """The sampling temperature (``sampling.temperature``)."""
        return self.sampling.temperature

    def abort(self) -> None:
        """End the running ``generate`` at its next token (unfinished responses: ``abort``)."""
        self._abort.set()

    def generate(self, prompts: Sequence[Prompt], n: int, max_new_tokens: int, stop: Optional[list] = None,
                 timeout_s: float = 60.0, on_finish: Optional[OnFinish] = None) -> RolloutBatch:
        """Sample ``n`` responses per prompt (prompt-major order). See the module docstring.

        Raises:
            ValueError: n < 1, max_new_tokens < 1, timeout_s <= 0, or a prompt without token_ids.
            EngineNotReady: ``version`` is None.
        """
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        _check_args(n, max_new_tokens, timeout_s)
        if self.version is None:
            raise EngineNotReady("the engine has no published policy version (weight sync incomplete)")
        for p in prompts:
            if not p.token_ids:
                raise ValueError(f"prompt {p.uid!r} has no token_ids: tokenize it with ops.rl.policy.chat_prompt")
        with self.lock:
            self._abort.clear()
            version = self.version
            rows = [(p, i) for p in prompts for i in range(n)]
            width = max(len(p.token_ids) for p in prompts)
            ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            att = torch.zeros((len(rows), width), dtype=torch.long)
            for r, (p, _) in enumerate(rows):                    # left padding
                ids[r, width - len(p.token_ids):] = torch.tensor(p.token_ids)
                att[r, width - len(p.token_ids):] = 1
            dev = model_device(self.model)                       # a GPU engine actor's model is on cuda
            ids, att = ids.to(dev), att.to(dev)
            t0 = time.monotonic()
            rec = _Recorder(self.sampling)
            mon = _Monitor(rows, rec, self, version, max_new_tokens, list(stop or []), t0, t0 + timeout_s, on_finish)
            cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                                   eos_token_id=self.eos_id, pad_token_id=self.pad_id)
            with torch.no_grad():
                self.model.generate(input_ids=ids, attention_mask=att, generation_config=cfg,
                                    logits_processor=LogitsProcessorList([rec]),
                                    stopping_criteria=StoppingCriteriaList([mon]))
            mon.close(mon.reason or ("timeout" if time.monotonic() >= mon.deadline else "abort"))
            wall = time.monotonic() - t0
            busy = sum(len(t) for t in mon.tokens)
            total = len(rows) * max(mon.steps, 1)
            timings = {"wall_s": wall, "decode_steps": float(mon.steps), "slot_steps_busy": float(busy),
                       "slot_steps_total": float(total), "bubble_ratio": 1.0 - busy / total if total else 0.0}
            return RolloutBatch(mon.completions_in_order(), timings)


class _Recorder:
    """The last logits processor (``generate`` itself runs with T = 1 and no top-k/top-p): warps the
    scores to the sampling distribution (``ops.lm.sampling.warp_logits``) and keeps its log-softmax
    [B, V] — the distribution ``generate`` samples the next token from."""

    def __init__(self, sampling: SamplingConfig):
        self.sampling = sampling
        self.logp = None

    def __call__(self, input_ids, scores):
        import torch

        scores = warp_logits(scores, self.sampling)
        self.logp = torch.log_softmax(scores, dim=-1)
        return scores


class _Monitor:
    """The stopping criterion: per-sequence bookkeeping, on_finish, deadline and abort."""

    def __init__(self, rows, rec, engine, version, max_new_tokens, stop, t0, deadline, on_finish):
        self.rows, self.rec, self.engine, self.version = rows, rec, engine, version
        self.max_new, self.stop, self.t0, self.deadline, self.on_finish = max_new_tokens, stop, t0, deadline, on_finish
        B = len(rows)
        self.tokens: list[list[int]] = [[] for _ in range(B)]
        self.logps: list[list[float]] = [[] for _ in range(B)]
        self.done: list[Optional[Completion]] = [None] * B
        self.steps = 0
        self.aborted = False
        self.reason: Optional[str] = None          # why the batch ended early: "abort" | "timeout"

    def _finish(self, r: int, reason: str) -> Completion:
        p, i = self.rows[r]
        toks = self.tokens[r]
        c = Completion(p.uid, i, list(toks), list(self.logps[r]), reason, self.version, time.monotonic() - self.t0,
                       text=self.engine.tokenizer.decode(toks, skip_special_tokens=True))
        self.done[r] = c
        return c

    def _hit_stop(self, r: int) -> bool:
        if not self.stop:
            return False
        tail = self.engine.tokenizer.decode(self.tokens[r][-8:], skip_special_tokens=True)
        return any(s in tail for s in self.stop)

    def __call__(self, input_ids, scores, **kw):
        import torch

        self.steps += 1
        last = input_ids[:, -1]
        lp = (self.rec.logp.gather(1, last[:, None])[:, 0] if self.rec.logp is not None
              else torch.zeros(len(last), device=last.device))
        finished = []
        for r in range(len(self.rows)):
            if self.done[r] is not None:
                continue
            tok = int(last[r])
            self.tokens[r].append(tok)
            self.logps[r].append(float(lp[r]))
            if tok == self.engine.eos_id or self._hit_stop(r):
                finished.append((r, "stop"))
            elif len(self.tokens[r]) >= self.max_new:
                finished.append((r, "length"))
        for r, reason in finished:
            c = self._finish(r, reason)
            if self.on_finish is not None and not self.aborted and self.on_finish(c):
                self.aborted, self.reason = True, "abort"
        if not self.aborted and self.engine._abort.is_set():
            self.aborted, self.reason = True, "abort"
        if not self.aborted and time.monotonic() >= self.deadline:
            self.aborted, self.reason = True, "timeout"
        if self.aborted:
            return torch.ones(len(self.rows), dtype=torch.bool, device=input_ids.device)
        return torch.tensor([d is not None for d in self.done], dtype=torch.bool, device=input_ids.device)

    def close(self, reason: str) -> None:
        """Mark every response still open (``timeout`` past the deadline, else ``abort``); timed-out
        responses are reported to on_finish (they end the step like any other), aborted ones are not."""
        for r in range(len(self.rows)):
            if self.done[r] is None:
                c = self._finish(r, reason)
                if reason == "timeout" and self.on_finish is not None:
                    self.on_finish(c)

    def completions_in_order(self) -> list[Completion]:
        return list(self.done)


def guarded_generate(engine, prompts: Sequence[Prompt], n: int, max_new_tokens: int, stop: Optional[list] = None,
                     timeout_s: float = 60.0, on_finish: Optional[OnFinish] = None,
                     grace_s: float = 5.0) -> RolloutBatch:
    """``engine.generate`` with a hard limit of ``timeout_s + grace_s`` wall-clock seconds.

    The call runs in a daemon thread. If it has not returned by then, ``engine.abort()`` is tried;
    if it still does not return the call is abandoned: every response not yet delivered to
    ``on_finish`` is returned (and delivered) as ``timeout`` with no tokens, and late callbacks from
    the abandoned call are ignored. The engine is then flagged ``stalled = True`` (replace it).
    """
    lock = threading.Lock()
    delivered: dict[tuple[str, int], Completion] = {}
    closed = threading.Event()
    result: dict = {}

    def cb(c: Completion) -> bool:
        with lock:
            if closed.is_set():
                return True
            delivered[(c.prompt_uid, c.index)] = c
            return bool(on_finish(c)) if on_finish is not None else False

    def target():
        try:
            result["batch"] = engine.generate(prompts, n, max_new_tokens, stop=stop, timeout_s=timeout_s, on_finish=cb)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = e

    t0 = time.monotonic()
    th = threading.Thread(target=target, name="rollout", daemon=True)
    th.start()
    th.join(timeout_s + grace_s)
    if th.is_alive() and hasattr(engine, "abort"):
        engine.abort()
        th.join(grace_s)
    if "error" in result:
        raise result["error"]
    if "batch" in result:
        return result["batch"]
    with lock:
        closed.set()
        wall = time.monotonic() - t0
        out = []
        for p in prompts:
            for i in range(n):
                c = delivered.get((p.uid, i))
                if c is None:
                    c = Completion(p.uid, i, [], [], "timeout", getattr(engine, "version", None), wall)
                    if on_finish is not None:
                        on_finish(c)
                out.append(c)
    engine.stalled = True
    return RolloutBatch(out, {"wall_s": wall, "slot_steps_busy": 0.0, "slot_steps_total": 0.0, "bubble_ratio": 0.0,
                              "stalled": 1.0})


class VLLMEngine:
    """vLLM backend (GPU; the ``vllm`` extra, not installed on the embedded default).

    Same interface; tail batching's abort maps to ``LLMEngine.abort_request``. Imported only when
    constructed. Sampling as ``HFEngine`` (temperature, top-k, top-p; vLLM's sampler applies them in
    the same order), and the recorded log-probabilities are the *processed* ones
    (``logprobs_mode="processed_logprobs"``, vLLM >= 0.10.2): vLLM's default returns the raw model
    log-probabilities, which are not the sampled distribution at T != 1 or under top-k/top-p.

    Raises:
        ImportError: vLLM is not installed (the message says how to select the CPU engine).
    """

    def __init__(self, model_dir: str, temperature: float = 1.0, version: Optional[int] = 0, top_k: int = 0,
                 top_p: float = 1.0, sampling: Optional[SamplingConfig] = None, **engine_kw):
        self.sampling = sampling if sampling is not None else SamplingConfig(temperature, top_k, top_p)
        try:
            from vllm import LLMEngine, EngineArgs  # noqa: F401
        except ImportError as e:
            raise ImportError("the vLLM engine needs the vllm extra: pip install 'crucible[vllm]' (GPU machines); "
                              "use engine='hf' on CPU") from e
        engine_kw.setdefault("logprobs_mode", "processed_logprobs")
        self.engine = LLMEngine.from_engine_args(EngineArgs(model=model_dir, **engine_kw))
        self.version = version
        self.tokenizer = self.engine.get_tokenizer()

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    def generate(self, prompts: Sequence[Prompt], n: int, max_new_tokens: int, stop: Optional[list] = None,
                 timeout_s: float = 60.0, on_finish: Optional[OnFinish] = None) -> RolloutBatch:
        from vllm import SamplingParams

        _check_args(n, max_new_tokens, timeout_s)
        sp = SamplingParams(n=1, **self.sampling.vllm_kwargs(), max_tokens=max_new_tokens, stop=stop or None,
                            logprobs=0)
        t0 = time.monotonic()
        reqs = {}
        for p in prompts:
            for i in range(n):
                rid = f"{p.uid}\x00{i}"
                self.engine.add_request(rid, {"prompt_token_ids": list(p.token_ids)}, sp)
                reqs[rid] = None
        stopped = False
        while self.engine.has_unfinished_requests() and not stopped:
            if time.monotonic() - t0 > timeout_s:
                break
            for out in self.engine.step():
                if not out.finished:
                    continue
                o = out.outputs[0]
                uid, i = out.request_id.split("\x00")
                lps = [next(iter(d.values())).logprob for d in (o.logprobs or [])]
                c = Completion(uid, int(i), list(o.token_ids), lps, "length" if o.finish_reason == "length" else "stop",
                               self.version, time.monotonic() - t0, text=o.text)
                reqs[out.request_id] = c
                if on_finish is not None and on_finish(c):
                    stopped = True
                    break
        reason = "abort" if stopped else "timeout"
        wall = time.monotonic() - t0
        for rid, c in reqs.items():
            if c is None:
                self.engine.abort_request(rid)
                uid, i = rid.split("\x00")
                reqs[rid] = Completion(uid, int(i), [], [], reason, self.version, wall)
                if reason == "timeout" and on_finish is not None:
                    on_finish(reqs[rid])
        return RolloutBatch(list(reqs.values()), {"wall_s": wall})
