"""Policies for the RL core: a tiny random-init Llama for tests, the SmolLM2 directory for real runs,
and the chat prompt of a math problem (torch and transformers imported inside functions)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .types import Prompt

#: The instruction appended to every problem: the reward reads the last ``\\boxed{}``.
INSTRUCTION = "Solve the problem. Put the final answer in \\boxed{}."


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of a Hugging Face model directory (pad = eos when it has no pad token).

    Raises:
        FileNotFoundError: the directory has no tokenizer.json (run ``make setup``).
    """
    from transformers import AutoTokenizer

    d = Path(model_dir)
    if not (d / "tokenizer.json").exists():
        raise FileNotFoundError(f"policy model directory {d} has no tokenizer.json; run `make setup`")
    tok = AutoTokenizer.from_pretrained(str(d))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_policy(vocab_size: int, seed: int = 0, hidden: int = 32, layers: int = 2, eos_token_id: int = 2,
                pad_token_id: Optional[int] = 2):
    """A random-init 2-layer Llama (tests: ~1.6 M parameters at a 49,152 vocabulary)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=1, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def load_policy(model_dir: str | Path, dtype: str = "float32"):
    """The causal LM of a Hugging Face directory (``.models/SmolLM2-135M-Instruct`` by default setup).

    Raises:
        FileNotFoundError: no config.json in ``model_dir``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    d = Path(model_dir)
    if not (d / "config.json").exists():
        raise FileNotFoundError(f"policy model directory {d} has no config.json; run `make setup`")
    return AutoModelForCausalLM.from_pretrained(str(d), dtype=getattr(torch, dtype)).eval()


def chat_prompt(tokenizer, uid: str, problem: str, answer: Optional[str] = None, solution: Optional[str] = None,
                answer_type: str = "numeric", max_prompt_tokens: int = 256) -> Prompt:
    """A Prompt whose token_ids are the chat template of ``problem`` + INSTRUCTION (generation
    prompt added; truncated from the left of the problem to ``max_prompt_tokens``)."""
    text = f"{problem.strip()}\n\n{INSTRUCTION}"
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
    else:
        ids = tokenizer(text)["input_ids"]
    ids = list(ids)[-max_prompt_tokens:]
    return Prompt(uid=uid, token_ids=tuple(int(t) for t in ids), text=problem, answer=answer, solution=solution,
                  answer_type=answer_type)
