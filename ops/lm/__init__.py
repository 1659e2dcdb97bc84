"""The LM substrate: what every causal-LM training worker of the project is built from (the CPT probes,
docs/mixture.md "Probe grid"; the SFT stages, docs/posttrain.md "Stage-1 SFT").

- ``model``: the GPT-2-style model of a size (``gpt2``), loading and atomic saving of a model folder
  (``config.json`` + ``model.safetensors`` + ``optimizer.pt``), parameter counts.
- ``data``: token block streams (``BlockStream``), loss-masked packed examples (``Example``,
  ``pack``, ``PackedStream``) and the mixed global batch of two streams at a ratio
  (``mixture_counts``, ``MixedBatches``); every stream is a pure function of its position, which is
  what a checkpoint records.
- ``train``: the data-parallel group (``DataParallel``), AdamW and the learning-rate schedules, the
  losses, and the one training loop (``Trainer``: steps, evaluation, checkpoint save and resume of
  model, optimizer, scheduler, step, RNG and data position; atomic through ``ops.lake``), plus the
  fault injection of the resume tests.
- ``evaluate``: validation losses of block streams, teacher-forced response losses and token
  log-probabilities, summed or gathered over the ranks.
- ``sampling``: the sampling distribution (``SamplingConfig``: temperature, top-k, top-p through
  transformers' warpers) and ``sampling_logprobs``, shared by generation here and by the RL engines
  and trainer (``ops.rl``), so sampled tokens are scored with the distribution they came from.
- ``generate``: greedy and sampled continuation (temperature, top-k, top-p) of left-padded prompts.

torch and transformers load inside the functions, so that importing a spec module stays cheap.
"""
