"""The RL roles on a GPU, for a lent device machine (docs/operations.md, "Ray clusters"): a local Ray
that advertises the machine's GPUs, RollPacker's engine and trainer actors with ``engine_gpus`` /
``trainer_gpus`` (``num_gpus`` on Ray; the models on the CUDA device Ray assigns), the reward actor,
and a few real GRPO steps of the synchronous baseline on the scratchpad task, with the tiny random
policy or a warm-started ``rl_policy`` folder.

    .venv/bin/python benchmarks/gpu_rl_smoke.py --gpus 1 --out $OUT/gpu_rl_smoke.json   # device machine
    .venv/bin/python benchmarks/gpu_rl_smoke.py --gpus 0                                 # CPU: same code path

It records, per step, the rollout and step seconds and the policy version, and where each actor ran
(``torch.cuda.get_device_name`` inside the actor, or cpu). A GPU request that gets no CUDA device
fails naming the field (``ops.rl.ray_actors.role_device``). Exit code 0 only when every step ran
and the engine ends on version ``steps``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import bench_parser, command_line, write_results  # noqa: E402


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--gpus", type=float, default=1.0, help="num_gpus of the engine and of the trainer actor")
    ap.add_argument("--policy", default="", help="a scratchpad policy folder (rl_policy); empty = a 20-step warm start")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)

    import ray
    import torch

    from ops.rl.ray_actors import Actors
    from ops.rl.rollpacker.driver import RunSpec, RunState, fingerprint, load_prompts, result_fields, run_methods
    from ops.rl.policy import load_tokenizer
    from tests.conftest import RecordingPipes

    work = Path(a.out).parent if a.out else Path("/tmp/gpu_rl_smoke")
    work.mkdir(parents=True, exist_ok=True)
    policy = a.policy
    if not policy:
        from ops.rl.warmstart import WarmStartSpec, train

        spec = WarmStartSpec(out_dir=str(work / "policy"), max_steps=20, batch_problems=8, eval_every=20, eval_size=8,
                             final_eval_size=8, n_embd=64, n_layer=2, checkpoint_every=20).validate()
        train(spec, work / "ws", RecordingPipes(0))
        policy = str(work / "policy")
    spec = RunSpec(task="scratchpad", tokenizer_dir=policy, model_dir=policy, methods=["baseline"], steps=a.steps,
                   prompts_per_step=4, responses_per_prompt=4, max_new_tokens=64, timeout_s=120, lr=1e-5,
                   engine_gpus=a.gpus, trainer_gpus=a.gpus).validate()
    t0 = time.monotonic()
    ray.init(num_cpus=2, num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False)
    try:
        actors = Actors(spec.policy(), spec.policy(), reward_item_timeout_s=20)

        @ray.remote(num_cpus=0, num_gpus=a.gpus)
        def device_name():
            import torch as t
            return t.cuda.get_device_name(0) if t.cuda.is_available() else "cpu"

        where = ray.get(device_name.remote(), timeout=120) if a.gpus > 0 else "cpu"
        state = RunState(work / "state", fingerprint(spec))
        rows = run_methods(spec, load_prompts(spec, load_tokenizer(policy)), RecordingPipes(0), actors, state)
        res = result_fields(spec, rows, state.evals)
        actors.kill()
    finally:
        ray.shutdown()
    out = {"command": command_line(__file__, argv), "gpus": a.gpus,
           "device": where, "cuda_devices": torch.cuda.device_count(), "wall_s": round(time.monotonic() - t0, 2),
           "steps": [{k: r[k] for k in ("step", "rollout_s", "step_s", "policy_version", "reward_mean")} for r in rows],
           "weight_syncs": res["weight_syncs"]}
    print(json.dumps(out, indent=1))
    if a.out:
        write_results(out, a.out)
    ok = len(rows) == a.steps and res["weight_syncs"]["baseline"]["policy_version"] == a.steps
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
