"""The sampling distribution of the rollout engines, shared with the trainer.

An RL trainer's old policy pi_old is the distribution the engine *sampled* from, not the model's raw
softmax: with temperature T, top-k and top-p (nucleus) sampling, the engine draws each token from

    p(x) = softmax(top_p(top_k(logits / T)))        (filtered logits = -inf, so p = 0 there)

and the PPO ratio pi / pi_old is 1 on an unchanged policy only when the trainer scores the sampled
tokens with the same warped distribution (case ``logprob-temperature-consistent``). One function,
``sampling_logprobs``, computes it for both sides: the engine's last logits processor
(``ops.rl.engine.HFEngine``) and the trainer (``ops.rl.grpo.token_logprobs``). Both read their
parameters from one ``SamplingConfig``, built from the same actor spec (``SamplingConfig.from_spec``).

Semantics are those of transformers' ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and
``TopPLogitsWarper`` (which are called), in the order transformers' ``generate`` and vLLM's sampler
apply them: temperature, then top-k, then top-p; top-k keeps ties with the k-th logit, top-p drops
the smallest tokens whose cumulative probability is <= 1 - top_p and always keeps >= 1 token.
Source: Holtzman et al., "The Curious Case of Neural Text Degeneration" (ICLR 2020, arXiv 1904.09751)
§3.1 for nucleus sampling; Fan et al. (ACL 2018) for top-k.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SamplingConfig:
    """How the engines sample (and so how the trainer scores).

    Attributes:
        temperature: T > 0; logits are divided by it.
        top_k: keep the k most likely tokens (0 = off).
        top_p: keep the smallest set of most likely tokens with probability >= top_p, in (0, 1]
            (1.0 = off).

    Raises:
        ValueError: a value out of range (the message names ``sampling.<field>``).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ValueError(f"sampling.temperature must be > 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"sampling.top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"sampling.top_p must be in (0, 1] (1.0 = off), got {self.top_p!r}")
        object.__setattr__(self, "temperature", float(self.temperature))   # the HF warpers want floats
        object.__setattr__(self, "top_p", float(self.top_p))

    @classmethod
    def from_spec(cls, spec: dict) -> "SamplingConfig":
        """The sampling settings of an actor spec (``temperature``, ``top_k``, ``top_p``; other keys
        are ignored, missing ones take the defaults). The engine and the trainer actors both call
        this on the spec the driver gives them."""
        return cls(float(spec.get("temperature", 1.0)), int(spec.get("top_k", 0)), float(spec.get("top_p", 1.0)))

    def spec(self) -> dict:
        """``{"temperature", "top_k", "top_p"}`` (what ``from_spec`` reads)."""
        return asdict(self)

    @property
    def filters(self) -> bool:
        """True when top-k or top-p removes tokens (the distribution is not the tempered softmax)."""
        return self.top_k > 0 or self.top_p < 1.0

    def vllm_kwargs(self) -> dict:
        """The same settings as ``vllm.SamplingParams`` keyword arguments (top_k -1 = off)."""
        return {"temperature": self.temperature, "top_k": self.top_k if self.top_k > 0 else -1, "top_p": self.top_p}


def warp_logits(logits, cfg: SamplingConfig):
    """Logits [..., V] -> the float32 logits the engine samples from (temperature, top-k, top-p;
    filtered entries -inf). Differentiable in the kept entries; the top-k/top-p mask is a constant."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = logits.float()
    if cfg.temperature != 1.0:
        scores = TemperatureLogitsWarper(cfg.temperature)(None, scores)
    if not cfg.filters:
        return scores
    shape = scores.shape
    flat = scores.reshape(-1, shape[-1])                                # the warpers index dim 1: [N, V]
    if cfg.top_k > 0:
        flat = TopKLogitsWarper(cfg.top_k)(None, flat)
    if cfg.top_p < 1.0:
        flat = TopPLogitsWarper(cfg.top_p)(None, flat)
    return flat.reshape(shape)


def sampling_logprobs(logits, cfg: SamplingConfig):
    """Log-probabilities [..., V] (float32) of the engine's sampling distribution given model logits
    [..., V]: ``log_softmax(warp_logits(logits, cfg))``; -inf on tokens top-k/top-p removed."""
    import torch

    return torch.log_softmax(warp_logits(logits, cfg), dim=-1)
