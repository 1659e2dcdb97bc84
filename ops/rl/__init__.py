"""The RL core shared by RollPacker (docs/rollpacker.md, arXiv 2509.21009) and RollArc (docs/rollarc.md,
arXiv 2512.22560): rollout engines behind one interface, versioned weight sync, the GRPO loss, and a
rule-based math reward served over HTTP.

Modules (torch-free unless marked):
    types     Prompt, Completion, RolloutBatch: what an engine returns (tokens, log-probs,
              finish_reason, policy version, timings)
    (sampling: ``ops.lm.sampling`` -- SamplingConfig and sampling_logprobs, the one function the
              engine records log-probs with and the trainer scores with)
    engine    Engine protocol; HFEngine (transformers ``generate`` on CPU, torch); VLLMEngine
              (optional GPU backend, imported only when selected); guarded_generate (hard
              wall-clock limit around any engine call)
    weights   versioned weight sync: a version is published only after a complete sync and only
              forward; a failed commit is rolled back (torch)
    grpo      group-normalised advantages and the clipped GRPO loss with optional KL (torch)
    reward    math reward via ``ops.curation.verify``; RewardScorer (verifier processes, adaptive
              per-problem timeout; in a Ray actor, reached by actor calls) and RewardClient
              (bounded retries, backoff, per-request timeouts, over Ray or an external HTTP
              endpoint); failed scores are None/NaN + flag, never 0.0
    policy    tiny random-init policies for tests; loading the SmolLM2 directory; chat prompts
    ray_actors  engine / trainer / reward service as Ray actors, with driver-side proxies that keep
              the in-process interfaces (RollArc reuses them with its own scheduler)

``ops.rl.rollpacker`` builds tail batching, the reward scheduler and the stream trainer on these.
"""
