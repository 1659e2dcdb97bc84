"""Ray hosting of the RL roles (shared by RollPacker and RollArc): rollout engines, the reward
service and the trainer as actors, and driver-side proxies with the in-process interfaces
(``Engine``, ``StreamTrainer``), so schedulers run unchanged on one process or a cluster.

* ``EngineActor`` (threaded, max_concurrency 2): an HFEngine; ``generate`` pushes each finished
  response to a ``ray.util.queue.Queue`` as it ends, and ``abort`` (the second thread) ends the
  batch — tail batching across processes. ``update_weights`` is the versioned sync
  (``ops.rl.weights``): the version is published only after every tensor is copied, and only
  forward (an older or equal version is refused and counted: ``sync_stats``).
* ``RewardActor``: runs ``ops.rl.reward.RewardScorer`` (its own verifier processes); the driver
  calls it through Ray (``RewardClient`` over ``RayRewardTransport``), from any node.
* ``TrainerActor``: the policy, its optimizer and a StreamTrainer.

The engine and the trainer read their sampling distribution from the same spec keys
(``temperature``, ``top_k``, ``top_p``: ``ops.lm.sampling.SamplingConfig.from_spec``), so the
trainer's old policy is the distribution the engine sampled from; drivers pass one spec to both.

Resume (``Actors.save_state`` / ``Actors.restore``): between steps the trainer writes its policy
weights, optimizer state, policy version and RNG, and the engine its sampling RNG, to files (the
actors write them: on a cluster the folder must be on storage every node mounts); a relaunch loads
them and publishes the weights to the engine through the versioned sync. ``LocalActors`` runs the
same roles in the calling process, without Ray (tests, debugging).

Every ``ray.get`` has a timeout. ``ray`` is imported inside functions (``make_actors``).
"""

from __future__ import annotations

import os
import time
from typing import Optional

from .reward import LocalRewardTransport, RayRewardTransport
from .types import RolloutBatch


def role_device(spec: dict, role: str):
    """The torch device of a role (``role`` is ``engine`` or ``trainer``): ``cuda`` when the spec's
    ``<role>_gpus`` > 0 (Ray then sets CUDA_VISIBLE_DEVICES for the actor), else ``cpu``. Raises
    RuntimeError naming the field when GPUs were requested but no CUDA device is visible."""
    import torch

    if float(spec.get(f"{role}_gpus", 0) or 0) <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"{role}_gpus = {spec[f'{role}_gpus']} but no CUDA device is visible to this {role} actor "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); set {role}_gpus 0 on CPU")
    return torch.device("cuda")


def _build_policy(spec: dict, role: str = "engine"):
    from .policy import load_policy, load_tokenizer, tiny_policy

    device = role_device(spec, role)
    tok = load_tokenizer(spec["tokenizer_dir"])
    if spec.get("model_dir"):
        model = load_policy(spec["model_dir"])
    else:
        model = tiny_policy(len(tok), seed=spec.get("seed", 0), hidden=spec.get("tiny_hidden", 64),
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return model.to(device), tok


class _TorchRole:
    """The body of a torch-hosted role (the engine or the trainer, in an actor or in process): keeps
    its spec, sets torch's intra-op threads from ``spec["threads"]`` (default 1) and builds the role's
    initial policy with ``_build`` (the subclass's reset to version 0)."""

    def __init__(self, spec: dict):
        import torch

        torch.set_num_threads(spec.get("threads", 1))
        self.spec = spec
        self._build()

    def _build(self) -> int:
        raise NotImplementedError


class _EngineImpl(_TorchRole):
    def reset(self) -> int:
        """Back to the initial policy (version 0) and the initial sampling seed."""
        import torch

        from .engine import HFEngine

        torch.manual_seed(self.spec.get("seed", 0) + 1000)
        model, tok = _build_policy(self.spec)
        self.engine = HFEngine.from_spec(model, tok, self.spec, version=0)
        return 0

    _build = reset

    def generate(self, prompts, n, max_new_tokens, stop, timeout_s, out_queue) -> RolloutBatch:
        def on_finish(c):
            out_queue.put(c, timeout=30)
            return False

        return self.engine.generate(prompts, n, max_new_tokens, stop=stop, timeout_s=timeout_s, on_finish=on_finish)

    def abort(self) -> None:
        self.engine.abort()

    def update_weights(self, state: dict, version: int) -> int:
        from .weights import sync_weights

        return sync_weights(self.engine, state, version)

    def version(self) -> Optional[int]:
        return self.engine.version

    def sync_stats(self) -> dict:
        """``ops.rl.weights.sync_stats`` of the engine: policy_version, stale_syncs_refused, failed_syncs."""
        from .weights import sync_stats

        return sync_stats(self.engine)

    def save_rng(self, path: str) -> None:
        """Write this process's torch RNG state (the sampling stream) to ``path`` (temporary file, then rename)."""
        import torch

        _save_atomic({"rng": torch.get_rng_state()}, path)

    def load_rng(self, path: str) -> None:
        """Restore the sampling stream ``save_rng`` wrote. Raises FileNotFoundError naming the file."""
        import torch

        torch.set_rng_state(_load(path)["rng"])


def _save_atomic(obj, path: str) -> None:
    """``torch.save`` of ``obj`` to ``path`` through the project's atomic write (``ops.lake.atomic_path``)."""
    import torch

    from ops.lake import atomic_path

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _load(path: str) -> dict:
    import os

    import torch

    if not os.path.exists(path):
        raise FileNotFoundError(f"resume state {path} does not exist")
    return torch.load(path, map_location="cpu", weights_only=True)


class _TrainerImpl(_TorchRole):
    def reinit(self) -> int:
        """Back to the initial policy and a fresh optimizer (version 0)."""
        import torch

        from .grpo import GRPOConfig
        from .rollpacker.stream import StreamTrainer
        from ops.lm.sampling import SamplingConfig

        spec = self.spec
        model, tok = _build_policy(spec, "trainer")
        opt = torch.optim.AdamW(model.parameters(), lr=spec.get("lr", 1e-6), weight_decay=0.0)
        cfg = GRPOConfig(**spec.get("grpo", {}))
        ref = None
        if cfg.kl_coef > 0:                      # the KL's reference: a frozen copy of the initial policy
            import copy

            ref = copy.deepcopy(model).eval().requires_grad_(False)
        self.trainer = StreamTrainer(model, opt, cfg, micro_batch=spec.get("micro_batch", 2),
                                     max_grad_norm=spec.get("max_grad_norm", 1.0), pad_id=tok.pad_token_id,
                                     sampling=SamplingConfig.from_spec(spec), ref_model=ref)  # the engine's, same spec
        return 0

    _build = reinit

    def heldout(self, problems: list, temperature: float = 1.0, max_new_tokens: int = 256, seed: int = 0) -> dict:
        """Held-out pass rate of the trainer's current policy on scratchpad problems
        (``ops.rl.scratchpad.heldout_accuracy``; ``problems``: ``Problem`` or ``(uid, a, n)``
        tuples), with the policy version it measured. Between steps only (no gradients held)."""
        from . import scratchpad as sp
        from .policy import load_tokenizer

        if not hasattr(self, "_tok"):
            self._tok = load_tokenizer(self.spec["tokenizer_dir"])
        probs = [p if isinstance(p, sp.Problem) else sp.Problem(*p) for p in problems]
        model = self.trainer.model
        was_training = model.training
        model.eval()
        try:
            out = sp.heldout_accuracy(model, self._tok, probs, temperature, max_new_tokens, seed=seed)
        finally:
            model.train(was_training)
        return {**out, "policy_version": self.trainer.version}

    def add(self, samples) -> None:
        self.trainer.add(samples)

    def step(self) -> dict:
        return self.trainer.step()

    def reset(self) -> None:
        self.trainer._reset()

    def state(self) -> dict:
        from .weights import export_state

        return export_state(self.trainer.model)

    def save_checkpoint(self, path: str) -> int:
        """Write the trainer between steps — policy weights, optimizer state, policy version, torch
        RNG — to ``path`` (temporary file, then rename). Returns the version saved. Raises
        RuntimeError when gradients of an unfinished step are accumulated."""
        import torch

        tr = self.trainer
        if tr.samples:
            raise RuntimeError(f"trainer holds gradients of {tr.samples} samples of an unfinished step: save between steps")
        _save_atomic({"model": tr.model.state_dict(), "optimizer": tr.opt.state_dict(), "version": tr.version,
                      "rng": torch.get_rng_state()}, path)
        return tr.version

    def load_checkpoint(self, path: str) -> int:
        """Restore what ``save_checkpoint`` wrote (onto the policy this actor builds from its spec).
        Returns the policy version. Raises FileNotFoundError naming the file, RuntimeError when the
        weights do not fit the policy."""
        import torch

        st = _load(path)
        tr = self.trainer
        tr.model.load_state_dict(st["model"])
        tr.opt.load_state_dict(st["optimizer"])
        tr.version = int(st["version"])
        torch.set_rng_state(st["rng"])
        tr._reset()
        return tr.version


class _RewardImpl:
    """The reward actor's body: a ``RewardScorer`` (verifier processes of its own), called through
    Ray (``RayRewardTransport``), so a driver on any node reaches it."""

    def __init__(self, workers: int = 1, item_timeout_s: float = 10.0):
        from .reward import RewardScorer

        self.scorer = RewardScorer(workers=workers, item_timeout_s=item_timeout_s).start()

    def health(self) -> dict:
        return self.scorer.health()

    def score_dicts(self, items: list[dict]) -> list[dict]:
        return self.scorer.score_dicts(items)

    def stop(self) -> None:
        self.scorer.stop()


class RayEngine:
    """Driver-side Engine over an ``EngineActor``: responses stream back through a Ray queue as
    they finish; ``on_finish`` returning True sends ``abort`` to the actor. The queue actor is
    created once and reused (every put of a call completes before the call returns)."""

    def __init__(self, actor, rpc_timeout_s: float = 60.0):
        self.actor, self.rpc_timeout_s = actor, rpc_timeout_s
        self.version: Optional[int] = 0
        self._queue = None

    def generate(self, prompts, n, max_new_tokens, stop=None, timeout_s=60.0, on_finish=None) -> RolloutBatch:
        import ray
        from ray.util.queue import Empty, Queue

        if self._queue is None:
            self._queue = Queue(actor_options={"num_cpus": 0})
        q = self._queue
        ref = self.actor.generate.remote(list(prompts), n, max_new_tokens, stop, timeout_s, q)
        deadline = time.monotonic() + timeout_s + self.rpc_timeout_s
        aborted = False
        while time.monotonic() < deadline:
            try:
                c = q.get(block=True, timeout=0.05)
            except Empty:
                if ray.wait([ref], timeout=0)[0] and q.empty():
                    break
                continue
            if on_finish is not None and not aborted and on_finish(c):
                aborted = True
                self.actor.abort.remote()
        batch = ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
        self.version = batch.completions[0].policy_version if batch.completions else self.version
        return batch

    def abort(self) -> None:
        self.actor.abort.remote()

    def close(self) -> None:
        import ray

        if self._queue is not None:
            ray.kill(self._queue.actor)
            self._queue = None


class RayTrainer:
    """Driver-side StreamTrainer over a ``TrainerActor`` (``add``/``step``/``_reset`` with timeouts)."""

    def __init__(self, actor, rpc_timeout_s: float = 600.0):
        self.actor, self.rpc_timeout_s = actor, rpc_timeout_s

    def add(self, samples) -> None:
        import ray

        ray.get(self.actor.add.remote(list(samples)), timeout=self.rpc_timeout_s)

    def step(self) -> dict:
        import ray

        return ray.get(self.actor.step.remote(), timeout=self.rpc_timeout_s)

    def _reset(self) -> None:
        import ray

        ray.get(self.actor.reset.remote(), timeout=self.rpc_timeout_s)


class Actors:
    """One engine, one trainer and one reward actor (Ray must be initialised).

    Placement: the engine and the trainer ask for 1 CPU each, the reward service for 0 (it is
    I/O-bound; its verifier processes are its own), so a local ``ray.init(num_cpus=2)`` fits.
    ``reset()`` returns engine and trainer to the initial policy (version 0) without new processes,
    so several methods run on the same actors from the same start.

    Attributes (after construction): engine (RayEngine), trainer (RayTrainer), reward (the
    reward actor's ``RayRewardTransport``, for ``RewardClient``).
    """

    def __init__(self, engine_spec: dict, trainer_spec: dict, reward_workers: int = 1,
                 reward_item_timeout_s: float = 10.0, rpc_timeout_s: float = 600.0):
        import ray

        self.rpc_timeout_s = rpc_timeout_s
        Eng = ray.remote(num_cpus=1, num_gpus=engine_spec.get("engine_gpus", 0), max_concurrency=2)(_EngineImpl)
        Tr = ray.remote(num_cpus=1, num_gpus=trainer_spec.get("trainer_gpus", 0))(_TrainerImpl)
        Rw = ray.remote(num_cpus=0, max_concurrency=8)(_RewardImpl)    # concurrent score calls (reward scheduler)
        self.handles = [Eng.remote(engine_spec), Tr.remote(trainer_spec), Rw.remote(reward_workers, reward_item_timeout_s)]
        eng, tr, rw = self.handles
        ray.get([rw.health.remote(), eng.version.remote(), tr.reset.remote()], timeout=rpc_timeout_s)
        self.reward = RayRewardTransport(rw)
        self.engine = RayEngine(eng)
        self.trainer = RayTrainer(tr, rpc_timeout_s)

    def reset(self) -> None:
        import ray

        eng, tr, _ = self.handles
        ray.get([eng.reset.remote(), tr.reinit.remote()], timeout=self.rpc_timeout_s)
        self.engine.version = 0

    def publish(self, _trainer, version: int) -> None:
        """Versioned sync trainer -> engine: returns once the engine has published ``version``."""
        import ray

        eng, tr, _ = self.handles
        state = tr.state.remote()
        self.engine.version = ray.get(eng.update_weights.remote(state, version), timeout=self.rpc_timeout_s)

    def sync_stats(self) -> dict:
        """The engine's weight-sync record (``ops.rl.weights.sync_stats``: policy_version,
        stale_syncs_refused, failed_syncs), for run metadata."""
        import ray

        return ray.get(self.handles[0].sync_stats.remote(), timeout=self.rpc_timeout_s)

    def save_state(self, trainer_path: str, engine_path: str) -> int:
        """Between steps: the trainer's state to ``trainer_path`` and the engine's sampling RNG to
        ``engine_path`` (written by the actors). Returns the policy version saved."""
        import ray

        eng, tr, _ = self.handles
        version, _ = ray.get([tr.save_checkpoint.remote(trainer_path), eng.save_rng.remote(engine_path)],
                             timeout=self.rpc_timeout_s)
        return version

    def restore(self, trainer_path: str, engine_path: str) -> int:
        """Load the trainer's state, publish its weights to the engine (versioned sync: returns once
        the engine holds that version) and restore the engine's sampling RNG. Call after ``reset``.
        Returns the policy version."""
        import ray

        eng, tr, _ = self.handles
        version = ray.get(tr.load_checkpoint.remote(trainer_path), timeout=self.rpc_timeout_s)
        self.publish(self.trainer, version)
        ray.get(eng.load_rng.remote(engine_path), timeout=self.rpc_timeout_s)
        return version

    def kill(self) -> None:
        import ray

        self.engine.close()
        for h in self.handles:
            ray.kill(h)


class LocalActors:
    """``Actors``' interface with the roles in this process (no Ray): the same ``_EngineImpl``,
    ``_TrainerImpl`` and ``_RewardImpl`` called directly. For tests and debugging; the engine and
    the trainer share this process's torch RNG, so runs are reproducible only against other
    ``LocalActors`` runs.

    Attributes: engine (the HFEngine), trainer (the StreamTrainer), reward (a ``LocalRewardTransport``).
    """

    def __init__(self, engine_spec: dict, trainer_spec: dict, reward_workers: int = 1,
                 reward_item_timeout_s: float = 10.0, rpc_timeout_s: float = 600.0):
        self._eng, self._tr = _EngineImpl(engine_spec), _TrainerImpl(trainer_spec)
        self._rw = _RewardImpl(reward_workers, reward_item_timeout_s)
        self.reward = LocalRewardTransport(self._rw.scorer)

    @property
    def engine(self):
        return self._eng.engine

    @property
    def trainer(self):
        return self._tr.trainer

    def reset(self) -> None:
        self._eng.reset()
        self._tr.reinit()

    def publish(self, _trainer, version: int) -> None:
        self._eng.update_weights(self._tr.state(), version)

    def sync_stats(self) -> dict:
        return self._eng.sync_stats()

    def save_state(self, trainer_path: str, engine_path: str) -> int:
        self._eng.save_rng(engine_path)
        return self._tr.save_checkpoint(trainer_path)

    def restore(self, trainer_path: str, engine_path: str) -> int:
        version = self._tr.load_checkpoint(trainer_path)
        self.publish(self.trainer, version)
        self._eng.load_rng(engine_path)
        return version

    def kill(self) -> None:
        self._rw.stop()
