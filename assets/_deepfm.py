"""The DeepFM hyper-parameters that both CTR trainings show in the Launchpad: ``ctr_model`` (one
process, docs/sparse.md) and ``gba_run`` (every GBA mode, docs/gba.md). Defaults and meanings are
``ops.sparse.config.TrainConfig``'s; each asset's config adds its own fields and declares the ops
dataclass it mirrors (``assets._config.mirrors``)."""


from ops.sparse.config import TrainConfig

from ._config import fields_of, mirrors


@mirrors(TrainConfig)
class DeepFMConfig(fields_of(TrainConfig, exclude=("epochs", "batch_size", "coalesce", "threads"))):
    """The DeepFM model (Guo et al. 2017) on the sparse engine and its two optimizers."""

