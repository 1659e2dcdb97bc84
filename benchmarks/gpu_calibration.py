"""Measure prefill and decode step times of randomly initialised 0.5B / 1.5B / 7B-class models on one
GPU, for the roofline of the RL simulator (``sim.roofline``; docs/rollpacker.md and docs/rollarc.md,
section "Simulator").

    .venv/bin/python benchmarks/gpu_calibration.py                 # one GPU, bf16, < 8 min
    .venv/bin/python benchmarks/gpu_calibration.py --tiny --out /tmp/cal.json   # CPU, seconds

Models are transformers ``Qwen2Config`` objects with the shapes of ``sim.roofline.MODELS`` (no
download, random weights: step time does not depend on the values). For every model:

* prefill: ``batch`` prompts of ``context`` tokens, one forward pass with a KV cache, logits of the
  last position only (what a serving engine computes);
* decode: one-token forward passes of ``batch`` sequences over a ``StaticCache`` already holding
  ``context`` tokens (filled with random values, not prefilled: same memory traffic), so every step
  reads the weights and the batch's KV cache. On CUDA the step is captured in a CUDA graph when
  that works (serving engines replay graphs; eager HF adds ~10-30 ms of Python per step), else it
  runs eagerly; ``decode_mode`` says which.

Each point is the median of ``--reps`` timed runs after warm-up (CUDA events on GPU). Points whose
KV cache would not fit in free memory are skipped and listed; the run stops measuring new points
after ``--budget-s`` seconds. The JSON (``crucible.gpu_calibration/1``) records the device, its
``sim.roofline`` profile id (``--profile`` or from the device name), every point with the roofline's
prediction next to the measurement, and the command. ``sim.roofline.Roofline`` uses it for the
matching profile (measured times override the roofline, interpolated by batch and context).
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import bench_parser, command_line, write_results  # noqa: E402

from sim.roofline import (CALIBRATION_PATH, CALIBRATION_SCHEMA, MODELS, PROFILES, Roofline,  # noqa: E402
                          profile_for_device)

GPU_MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b")
GPU_GRID = {"decode_batches": (1, 4, 16, 64, 256), "decode_contexts": (256, 1024, 4096, 16384),
            "prefill_batches": (1, 4, 16), "prefill_contexts": (256, 1024, 4096), "max_prefill_tokens": 32768}
TINY_GRID = {"decode_batches": (1, 2, 4), "decode_contexts": (16, 64),
             "prefill_batches": (1, 2), "prefill_contexts": (16, 64), "max_prefill_tokens": 4096}


def hf_config(name: str):
    """A transformers Qwen2Config with the shape of ``sim.roofline.MODELS[name]``."""
    from transformers import Qwen2Config

    m = MODELS[name]
    return Qwen2Config(vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.intermediate,
                       num_hidden_layers=m.layers, num_attention_heads=m.heads, num_key_value_heads=m.kv_heads,
                       tie_word_embeddings=m.tie_embeddings, max_position_embeddings=65536,
                       attn_implementation="sdpa", use_cache=True)


def build_model(name: str, device, dtype):
    import torch
    from transformers import Qwen2ForCausalLM

    cfg = hf_config(name)
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model.eval()
    n = sum(p.numel() for p in model.parameters())
    if n != MODELS[name].params:
        raise RuntimeError(f"{name}: transformers built {n} parameters, sim.roofline counts {MODELS[name].params}")
    return model, cfg


class Timer:
    def __init__(self, device):
        import torch

        self.torch, self.cuda = torch, device.type == "cuda"

    def __call__(self, fn, warmup: int, reps: int) -> float:
        torch = self.torch
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(reps):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                out.append(a.elapsed_time(b) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
        return statistics.median(out)


def measure_prefill(model, cfg, device, batch: int, context: int, timer: Timer, warmup: int, reps: int) -> float:
    import torch
    from transformers import DynamicCache

    ids = torch.randint(0, cfg.vocab_size, (batch, context), device=device)

    def run():
        with torch.inference_mode():
            model(input_ids=ids, past_key_values=DynamicCache(config=cfg), use_cache=True, logits_to_keep=1)

    return timer(run, warmup, reps)


def measure_decode(model, cfg, device, dtype, batch: int, context: int, timer: Timer, warmup: int, reps: int,
                   graphs: bool) -> tuple[float, str]:
    """One decode step over a StaticCache holding ``context`` tokens; (seconds, mode)."""
    import torch
    from transformers import StaticCache

    steps = warmup + reps + 8
    cache = StaticCache(config=cfg, max_cache_len=context + steps)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    cache.early_initialization(batch, cfg.num_key_value_heads, head_dim, dtype, device)
    for layer in cache.layers:
        layer.keys.normal_()
        layer.values.normal_()
        layer.cumulative_length.fill_(context)
    ids = torch.randint(0, cfg.vocab_size, (batch, 1), device=device)
    pos = torch.tensor([context], device=device)

    def eager():
        with torch.inference_mode():
            model(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True, logits_to_keep=1)

    if graphs and device.type == "cuda":
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    eager()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(g):
                model(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True, logits_to_keep=1)
            for layer in cache.layers:
                layer.cumulative_length.fill_(context)
            return timer(g.replay, warmup, reps), "cuda_graph"
        except Exception as e:                                     # capture failed: time it eagerly
            torch.cuda.synchronize()
            for layer in cache.layers:
                layer.cumulative_length.fill_(context)
            mode = f"eager (cuda graph capture failed: {type(e).__name__}: {str(e)[:200]})"
            return timer(eager, warmup, reps), mode
    return timer(eager, warmup, reps), "eager"


def calibrate(args) -> dict:
    import torch

    tiny = args.tiny
    device = torch.device("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not tiny:
        raise SystemExit("no CUDA device: run with --tiny for the CPU check")
    dtype = torch.bfloat16
    grid = TINY_GRID if tiny else GPU_GRID
    models = ["tiny"] if tiny else [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"unknown model {m!r}; known: {sorted(MODELS)}")
    if device.type == "cuda":
        dev_name = torch.cuda.get_device_name(device)
        profile = args.profile or profile_for_device(dev_name)
    else:
        dev_name, profile = f"cpu ({platform.processor() or platform.machine()})", args.profile or "cpu-tiny"
    hw = PROFILES.get(profile)
    timer = Timer(device)
    t0 = time.perf_counter()
    out = {"schema": CALIBRATION_SCHEMA, "command": command_line(__file__),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "dtype": "bfloat16",
           "device": {"name": dev_name, "profile": profile, "profile_known": hw is not None,
                      "torch": torch.__version__, "cuda": torch.version.cuda},
           "grid": {k: list(v) if isinstance(v, tuple) else v for k, v in grid.items()},
           "models": {}, "skipped": [], "budget_s": args.budget_s}
    for name in models:
        if time.perf_counter() - t0 > args.budget_s:
            out["skipped"].append({"model": name, "why": "time budget spent"})
            continue
        tb = time.perf_counter()
        model, cfg = build_model(name, device, dtype)
        rl = Roofline(hw, MODELS[name]) if hw is not None else None
        md = {"config": MODELS[name].to_dict(), "build_s": round(time.perf_counter() - tb, 2), "prefill": [], "decode": []}
        for b in grid["prefill_batches"]:
            for c in grid["prefill_contexts"]:
                if b * c > grid["max_prefill_tokens"]:
                    continue
                if time.perf_counter() - t0 > args.budget_s:
                    out["skipped"].append({"model": name, "kind": "prefill", "batch": b, "context": c, "why": "time budget"})
                    continue
                s = measure_prefill(model, cfg, device, b, c, timer, args.warmup, args.reps)
                md["prefill"].append({"batch": b, "context": c, "seconds": s,
                                      "roofline_s": rl.raw_iteration_s(0, 0.0, [(c, 0.0)] * b) if rl else None})
        kvb = MODELS[name].kv_bytes_per_token
        for b in grid["decode_batches"]:
            for c in grid["decode_contexts"]:
                need = b * (c + args.warmup + args.reps + 8) * kvb
                if device.type == "cuda":
                    free = torch.cuda.mem_get_info(device)[0]
                    if need > 0.8 * free:
                        out["skipped"].append({"model": name, "kind": "decode", "batch": b, "context": c,
                                               "why": f"KV cache {need / 1e9:.1f} GB > 80% of free {free / 1e9:.1f} GB"})
                        continue
                if time.perf_counter() - t0 > args.budget_s:
                    out["skipped"].append({"model": name, "kind": "decode", "batch": b, "context": c, "why": "time budget"})
                    continue
                s, mode = measure_decode(model, cfg, device, dtype, b, c, timer, args.warmup, args.reps,
                                         graphs=not args.no_cuda_graphs)
                md["decode"].append({"batch": b, "context": c, "seconds": s, "decode_mode": mode,
                                     "roofline_s": rl.raw_iteration_s(b, float(b * c)) if rl else None})
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        for kind in ("prefill", "decode"):
            r = [p["seconds"] / p["roofline_s"] for p in md[kind] if p.get("roofline_s")]
            md[f"{kind}_measured_over_roofline"] = {"min": min(r), "median": statistics.median(r), "max": max(r)} if r else None
        out["models"][name] = md
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny config, seconds (the test)")
    ap.add_argument("--models", default=",".join(GPU_MODELS))
    ap.add_argument("--profile", default=None, help="sim.roofline profile id the device stands for (default: from its name)")
    ap.add_argument("--out", default=str(CALIBRATION_PATH))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new points after this many seconds")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    args = ap.parse_args(argv)
    if args.tiny:
        args.warmup, args.reps = min(args.warmup, 1), min(args.reps, 3)
    res = calibrate(args)
    write_results(res, args.out, indent=2)
    n = sum(len(m["prefill"]) + len(m["decode"]) for m in res["models"].values())
    print(f"{n} points, {len(res['skipped'])} skipped, {res['wall_s']} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
