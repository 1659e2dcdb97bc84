"""The teacher's request and result types (``ChatRequest``, ``ChatResult``), without the openai SDK:
the curation assets build requests at code-location load time, and the SDK's import (seconds) is
paid only where a client is made (``ops.teacher.client``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatRequest:
    """One sample to generate.

    Attributes:
        messages: OpenAI chat messages (role/content dicts).
        params: sampling parameters sent as-is (temperature, max_tokens, top_p, ...).
        sample_index: which of the k samples of this prompt (part of the cache key).
        tag: caller's id for the request (e.g. problem_id); not sent.
        seed: the sampler seed sent as the OpenAI ``seed`` field (part of the cache key); None sends none.
    """

    messages: tuple
    params: tuple
    sample_index: int = 0
    tag: str = ""
    seed: int | None = None

    @staticmethod
    def make(messages: list[dict], params: dict, sample_index: int = 0, tag: str = "", seed: int | None = None) -> "ChatRequest":
        if "seed" in params:
            raise ValueError("pass the sampler seed as ChatRequest.make(seed=...), not in params")
        return ChatRequest(tuple((m["role"], m["content"]) for m in messages), tuple(sorted(params.items())), sample_index, tag, seed)

    def body(self, model: str) -> dict:
        body = {"model": model, "messages": [{"role": r, "content": c} for r, c in self.messages], **dict(self.params)}
        if self.seed is not None:
            body["seed"] = self.seed
        return body


@dataclass
class ChatResult:
    """Outcome of one request. ``status`` is ``ok`` or ``failed`` (then ``error`` says why).

    ``system_fingerprint``: the endpoint's backend configuration as the response gave it (None if
    absent); ``seed_honoured``: the request carried a seed and the endpoint sampled with it.
    """

    request: ChatRequest
    status: str
    text: str | None = None
    error: str | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    attempts: int = 0
    cached: bool = False
    system_fingerprint: str | None = None
    seed_honoured: bool = False
