"""RollPacker: tail batching for synchronous RL (Gao et al., arXiv 2509.21009, NSDI 2026; docs/rollpacker.md).

Modules:
    scheduler  RoundPlanner (short rounds, long rounds, the FIFO long-prompt queue, or the
               synchronous veRL-style baseline) and run_round (accept the first R0 responses of the
               first P0 prompts, abort the rest) — engine-agnostic, torch-free
    stream     StreamTrainer: gradients on finished groups while others generate, deferred and
               renormalised optimizer step (torch)
    loop       one RL step on a real engine: rollout, reward scheduler, advantages, training
    driver     the Ray driver launched by the ``rollpacker_run`` asset through Dagster Pipes

The simulated engine and the paper-scale step-time model live outside ``ops``, in the discrete-event
simulator ``sim.des`` (``DESEngine``, ``simulate_rollpacker``; benchmarks and tests only).
"""
