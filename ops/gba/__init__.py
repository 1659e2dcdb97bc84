"""GBA — Global Batch gradients Aggregation over a parameter server (Su et al., NeurIPS 2022,
arXiv 2205.11048; docs/gba.md), against synchronous all-reduce, plain async PS, bounded staleness
(SSP) and backup workers (Hop-BW), on the DeepFM CTR model of ``ops.sparse``, under a seeded
straggler trace.

Modules, pure logic first (importable and testable without processes):
    errors     GBAConfigError, CheckpointError, LaunchError, RunFailed (imports nothing)
    config     RunSpec (mode + ONE set of hyper-parameters + cluster + policies + trace), validate; JOB,
               the job every mode shares (the asset's Launchpad config mirrors RunSpec, nested)
    staleness  f(tau), the pluggable staleness decay of token control; staleness histograms
    trace      StragglerTrace: seeded slowdowns (real extra forward/backward passes) shared by every mode
    switching  mode auto: the switch policy, the straggler detector (hysteresis) and the schedule
    control    token control and scheduling (GBA, async, SSP, Hop-BW) — no tensors
    aggregate  Gradient / Update / Aggregator: the averaging rule shared by every mode
    data       the encoded CTR data and the shared sample stream
    model      ServerModel (tables + dense on the PS), WorkerModel (gradient of a local batch)
    server     ParameterServer: control + aggregation + model + clock, thread-safe, transport-free
    ps         the PS modes over torch.distributed.rpc (rank 0 = PS, starts and watches W workers)
    sync       all-reduce data parallel (gloo), launched by accelerate
    checkpoint checkpoints of a run directory (atomic, fingerprinted) and resume; fault injection
    launch_ps, launch_sync   the entry-point modules the launches run (``python -m``, ``-m``)
    report     the per-mode summary row of a result file
    plots      AUC vs training time per mode

torch is imported only by the modules that need it; ``errors``, ``config``, ``checkpoint``, ``staleness``,
``trace``, ``switching``, ``control`` and ``report`` load without it. torchrec/fbgemm are never used.
"""
