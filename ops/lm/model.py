"""Causal LMs of the substrate: the GPT-2-style model of a probe size, model folders, parameter counts.

A model folder is what Hugging Face reads: ``config.json`` + ``model.safetensors``, plus
``optimizer.pt`` (the AdamW state) so that a later stage continues with the optimizer's moments
instead of restarting from zero moments, which is a transient of its own (docs/mixture.md,
"Probe grid"; docs/posttrain.md, "Stage 2 and the comparison"). Every file is written atomically
(``ops.lake.atomic_path``).
"""

from __future__ import annotations

from pathlib import Path


def quiet_transformers() -> None:
    """Keep transformers' logging at errors (a worker's log is its rank 0's Pipes stream)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def gpt2(vocab_size: int, n_positions: int, eot_id: int, shape: dict, seed: int):
    """A freshly initialised GPT-2 causal LM (``transformers.GPT2LMHeadModel``) without dropout.

    Args:
        vocab_size: tokens in the vocabulary.
        n_positions: context length (tokens).
        eot_id: the end-of-text token (BOS and EOS).
        shape: ``{"n_embd", "n_layer", "n_head"}`` (``ops.mixture.probe.SIZES``).
        seed: ``torch.manual_seed`` before the initialisation (same seed, same weights).
    Raises:
        ValueError: from transformers, e.g. ``n_embd`` not a multiple of ``n_head``.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, bos_token_id=eot_id, eos_token_id=eot_id,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **shape)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(cfg)


def param_counts(model) -> tuple[int, int]:
    """(non-embedding parameters N, all parameters): N leaves out the token and position embeddings
    (the D-CPT Law's N, arXiv 2406.01375 §3; tied output weights count once)."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    wpe = getattr(getattr(model, "transformer", None), "wpe", None)
    if wpe is not None:
        emb += wpe.weight.numel()
    return total - emb, total


def load_model(folder: str | Path, model=None):
    """The causal LM of a model folder: weights from ``model.safetensors`` loaded into ``model``, or
    when None into the ``AutoModelForCausalLM`` of its ``config.json``. Returns the model. Raises
    FileNotFoundError naming the missing file."""
    from safetensors.torch import load_model as load_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    for name in ("model.safetensors",) + (("config.json",) if model is None else ()):
        if not (folder / name).exists():
            raise FileNotFoundError(f"no model at {folder}: {folder / name} does not exist")
    if model is None:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)))
    load_weights(model, str(folder / "model.safetensors"))
    return model


def save_model(model, folder: str | Path, optimizer=None) -> None:
    """Write ``model.safetensors`` + ``config.json`` (and ``optimizer.pt`` when ``optimizer`` is
    given: its ``state_dict()``) into ``folder``, each atomically. ``model`` is unwrapped (no DDP)."""
    import torch
    from safetensors.torch import save_model as save_weights

    from ops.lake import atomic_path

    folder = Path(folder)
    with atomic_path(folder / "model.safetensors") as tmp:
        save_weights(model, str(tmp))
    with atomic_path(folder / "config.json") as tmp:
        model.config.to_json_file(str(tmp))
    if optimizer is not None:
        with atomic_path(folder / "optimizer.pt") as tmp:
            torch.save(optimizer.state_dict(), tmp)
