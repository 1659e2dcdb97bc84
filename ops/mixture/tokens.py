"""Tokenizer and token streams for the CPT probes (docs/mixture.md, "Corpora and tokenizer").

A byte-level BPE tokenizer (Hugging Face ``tokenizers``) is trained offline on the train splits of
both corpora, so no tokenizer is downloaded and general and domain text are tokenised alike. The
corpora are then written as flat ``uint16`` token streams (documents joined by the end-of-text id)
that the probe workers memory-map: ``general_{train,val}.npy``, ``domain_train.npy`` and one
``domain_<subdomain>_{train,val}.npy`` per sub-domain, plus ``manifest.json`` (token counts and the
sub-domain shares of the domain train stream).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ops.lake import atomic_path

EOT = "<|endoftext|>"


@dataclass
class TokenizerParams:
    """Parameters of the tokenizer and its streams (:func:`build_streams`), the ``cpt_tokenizer``
    run config.

    Raises:
        ValueError: ``vocab_size`` out of range (the message names it and the range).
    """

    vocab_size: int = 2048
    """Byte-level BPE vocabulary (tokens) in [300, 65535]: at least the 256 byte symbols plus merges,
    at most what the uint16 streams hold."""
    seed: int = 0
    """Seed of the shuffle of train documents before they are joined into a stream."""

    def __post_init__(self):
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, (int, np.integer)) \
                or not 300 <= self.vocab_size <= 65_535:
            raise ValueError(f"vocab_size must be in [300, 65535] (uint16 streams), got {self.vocab_size!r}")


def train_tokenizer(texts: list[str], vocab_size: int = TokenizerParams.vocab_size, min_frequency: int = 2):
    """Train a byte-level BPE tokenizer (id 0 = ``<|endoftext|>``) on ``texts``.

    Raises:
        ValueError: ``vocab_size`` outside :class:`TokenizerParams`'s range (streams are uint16),
            or no text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    TokenizerParams(vocab_size=vocab_size)  # the range check (uint16 streams)
    if not texts:
        raise ValueError("train_tokenizer: no text to train on")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _encode(tok, texts: list[str]) -> np.ndarray:
    eot = tok.token_to_id(EOT)
    parts = []
    for enc in tok.encode_batch(texts):
        parts.append(np.asarray(enc.ids, dtype=np.uint16))
        parts.append(np.asarray([eot], dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def _save(arr: np.ndarray, path: Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:   # a file object: np.save adds no ".npy"
        np.save(f, arr)


def build_streams(general: pl.DataFrame, domain: pl.DataFrame, out_dir: str | Path,
                  vocab_size: int = TokenizerParams.vocab_size, seed: int = TokenizerParams.seed) -> dict:
    """Train the tokenizer and write every token stream under ``out_dir``; return the manifest.

    ``general`` has ``text``, ``split``; ``domain`` has ``text``, ``subdomain``, ``split``. Train
    documents are shuffled (seeded) before joining so that a stream read in blocks mixes documents.

    Returns:
        manifest dict: ``vocab_size``, ``eot_id``, ``tokens`` ({stream: count}), ``subdomains``,
        ``subdomain_share`` ({subdomain: share of domain train tokens}), ``bytes_per_token``.
    Raises:
        ValueError: an empty train split in either corpus.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    g_train = general.filter(pl.col("split") == "train").sample(fraction=1.0, shuffle=True, seed=seed)
    d_train = domain.filter(pl.col("split") == "train").sample(fraction=1.0, shuffle=True, seed=seed)
    if g_train.is_empty() or d_train.is_empty():
        raise ValueError(f"build_streams: empty train split (general {g_train.height} docs, domain {d_train.height} docs)")
    tok = train_tokenizer(g_train["text"].to_list() + d_train["text"].to_list(), vocab_size)
    tok.save(str(out / "tokenizer.json"))
    counts: dict[str, int] = {}

    def put(name: str, texts: list[str]) -> np.ndarray:
        arr = _encode(tok, texts)
        _save(arr, out / f"{name}.npy")
        counts[name] = int(arr.size)
        return arr

    put("general_train", g_train["text"].to_list())
    put("general_val", general.filter(pl.col("split") == "val")["text"].to_list())
    put("domain_train", d_train["text"].to_list())
    subs = sorted(domain["subdomain"].unique().to_list())
    share = {}
    for s in subs:
        put(f"domain_{s}_val", domain.filter((pl.col("split") == "val") & (pl.col("subdomain") == s))["text"].to_list())
        n_train = int(_encode(tok, d_train.filter(pl.col("subdomain") == s)["text"].to_list()).size)
        share[s] = n_train / counts["domain_train"]
    nbytes = sum(len(t.encode()) for t in g_train["text"].to_list()[:2000])
    ntok = int(_encode(tok, g_train["text"].to_list()[:2000]).size)
    manifest = {"vocab_size": tok.get_vocab_size(), "eot_id": tok.token_to_id(EOT), "tokens": counts,
                "subdomains": subs, "subdomain_share": share, "bytes_per_token": nbytes / max(ntok, 1)}
    with atomic_path(out / "manifest.json") as tmp:
        tmp.write_text(json.dumps(manifest, indent=1))
    return manifest
