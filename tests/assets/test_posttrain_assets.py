"""The post-training chain end to end on a tiny lake: stage-1 SFT on 2 gloo ranks through Pipes +
accelerate, failure regions, targeted synthesis (generator + filter, synthesis-side templates only),
stage 2 with its random control (three seeds per arm), and the comparison with its verdict."""

import json

import dagster as dg
import numpy as np
import polars as pl

from assets import posttrain
from resources.compute import ComputeResource
from resources.lake import LakeResource
from resources.teacher import TeacherResource

MODULES = ["numbers__place_value", "numbers__is_factor", "comparison__pair"]


def _lake(tmp_path) -> LakeResource:
    from safetensors.torch import save_model
    from transformers import GPT2Config, GPT2LMHeadModel

    import torch

    from ops.mixture.tokens import build_streams

    lake = LakeResource(root=str(tmp_path / "lake"))
    rng = np.random.default_rng(0)
    words = ["the", "dress", "fits", "well", "soft", "love"]
    general = pl.DataFrame({"text": [" ".join(rng.choice(words, 20)) for _ in range(60)],
                            "split": ["val" if i % 10 == 0 else "train" for i in range(60)]})
    domain = pl.DataFrame({"text": [f"What is the tens digit of {n}? Is {n} a factor of {n * 3}? Which is bigger: {n} or -{n}?"
                                    for n in range(100, 160)],
                           "subdomain": ["arithmetic"] * 60, "split": ["val" if i % 10 == 0 else "train" for i in range(60)]})
    manifest = build_streams(general, domain, lake.base / "cpt_tokenizer", vocab_size=400)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=manifest["vocab_size"], n_positions=96, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    base = lake.base / "cpt_base_models" / "xs"
    base.mkdir(parents=True)
    save_model(GPT2LMHeadModel(cfg), str(base / "model.safetensors"))
    cfg.to_json_file(str(base / "config.json"))
    sft = pl.DataFrame({"problem_id": [f"p{i}" for i in range(30)], "problem": [f"Compute {i} + {i}." for i in range(30)],
                        "answer": [str(2 * i) for i in range(30)], "response": [f"{i} + {i} = \\boxed{{{2 * i}}}" for i in range(30)],
                        "answer_type": ["numeric"] * 30, "domain": ["math"] * 30, "difficulty": [1] * 30})
    (lake.base / "sft_dataset" / "data").mkdir(parents=True)
    sft.write_parquet(lake.base / "sft_dataset" / "data" / "train-00000.parquet")
    lake.write(pl.DataFrame({"benchmark": ["gsm8k_test", "math500"], "item_id": ["gsm8k/0", "math500/0"],
                             "problem": ["Janet has 3 apples and buys 2 more. How many apples does she have?", "Compute $1+1$."],
                             "answer": ["5", "2"], "solution": [None, None]}), "benchmark_problems", refresh=False)
    lake.write(pl.DataFrame({"problem": ["What is the tens digit of 1234?"], "solution": ["The tens digit is \\boxed{3}."]}),
               "decontaminated_problems", refresh=False)
    (lake.base / "mixture_plan").mkdir()
    (lake.base / "mixture_plan" / "plan.json").write_text(json.dumps({"tradeoff": {"r_d": 0.75}}))
    return lake


RUN_CONFIG = {"ops": {
    "sft_checkpoint": {"config": {"base_size": "xs", "modules": MODULES, "train_per_module": 8, "eval_per_module": 8,
                                  "steps": 6, "global_batch": 4, "schedule": {"warmup_steps": 2}, "checkpoint_every": 3,
                                  "benchmark_items": 2, "arithmetic_items": 3, "max_new_tokens": 6, "heldout_fraction": 0.2}},
    "failure_regions": {"config": {"k_topics": 3, "min_items": 2, "top_k": 2}},
    "targeted_synthesis": {"config": {"pool_per_module": 6, "budget": 8, "workers": 1}},
    "stage2_checkpoint": {"config": {"steps": 4, "global_batch": 4, "schedule": {"warmup_steps": 1}, "max_new_tokens": 6, "seeds": 3}},
    "failure_driven_comparison": {"config": {"n_boot": 100}},
}}


def test_chain_materializes_on_two_ranks_and_compares_targeted_with_random(tmp_path):
    lake = _lake(tmp_path)
    res = {"lake": lake, "compute": ComputeResource(num_processes=2, launch_timeout_s=300), "teacher": TeacherResource()}
    r = dg.materialize(posttrain.POSTTRAIN_ASSETS, resources=res, run_config=RUN_CONFIG)
    assert r.success
    meta = r.asset_materializations_for_node("sft_checkpoint")[0].metadata
    # two ranks really ran (accelerate --cpu --num_processes 2 would have started one)
    assert meta["world_size"].value == 2 and meta["distributed_type"].value == "DistributedType.MULTI_CPU"
    assert meta["domain_ratio"].value == 0.75 and "mixture_plan" in meta["domain_ratio_source"].value
    assert meta["pipes_messages"].value >= 1  # the loss was streamed from rank 0
    ev = lake.read("sft_checkpoint", name="eval.parquet")
    assert {"programmatic", "curated_heldout", "benchmark:gsm8k_test", "benchmark:math500",
            "benchmark:basic_arithmetic"} <= set(ev["slice"].to_list())
    assert set(ev.filter(pl.col("slice") == "programmatic")["split"].to_list()) == {"dev", "test"}
    train = lake.read("sft_checkpoint", name="train.parquet")
    assert not set(train["problem"].to_list()) & set(ev["problem"].to_list())  # nothing evaluated was trained on

    regions = lake.read("failure_regions")
    assert {"annotation", "topic"} <= set(regions["kind"].to_list()) and regions["rank"][0] == 1
    arms = lake.read("targeted_synthesis")
    t, rnd = arms.filter(pl.col("arm") == "targeted"), arms.filter(pl.col("arm") == "random")
    assert t.height == rnd.height > 0
    targets = json.loads(lake.path("failure_regions", name="targets.json").read_text())["targets"]
    assert set(t["module"].to_list()) <= {x["module"] for x in targets}
    # no synthesised item repeats an evaluation or training problem
    assert not set(arms["problem"].to_list()) & (set(ev["problem"].to_list()) | set(train["problem"].to_list()))
    # held out: no stage-2 item of either arm shares a (module, template) with an evaluation item
    from ops.posttrain.data import template_of

    prog = ev.filter(pl.col("slice") == "programmatic")
    eval_pairs = {(m, template_of(q)) for m, q in zip(prog["module"].to_list(), prog["problem"].to_list())}
    arm_pairs = {(m, template_of(q)) for m, q in zip(arms["module"].to_list(), arms["problem"].to_list())}
    assert eval_pairs and arm_pairs and not eval_pairs & arm_pairs

    # three seeds per arm, every one trained (its own data order, its own weights) and scored
    meta2 = r.asset_materializations_for_node("stage2_checkpoint")[0].metadata
    assert meta2["seeds"].value == [0, 1, 2]
    s2 = lake.base / "stage2_checkpoint"
    for arm in ("targeted", "random"):
        weights = set()
        for k in range(3):
            m = json.loads((s2 / arm / f"s{k}" / "metrics.json").read_text())
            assert m["seed"] == k and m["steps"] == 4 and len(m["curve"]) >= 1
            assert pl.read_parquet(s2 / arm / f"s{k}" / "predictions.parquet").height == ev.filter(pl.col("split") == "test").height
            weights.add((s2 / arm / f"s{k}" / "model.safetensors").read_bytes())
        assert len(weights) == 3  # the seeds really gave three different models
    per_seed = lake.read("stage2_checkpoint", name="scored_seeds.parquet")
    assert per_seed.group_by("checkpoint").agg(pl.col("seed").n_unique())["seed"].to_list() == [3, 3]

    cmp = json.loads(lake.path("failure_driven_comparison", name="comparison.json").read_text())
    cks = {row["checkpoint"] for row in cmp["table"]}
    assert cks == {"stage1", "stage2_targeted", "stage2_random"}
    fs = [row for row in cmp["table"] if row["slice"] == "failure_slices"]
    assert len(fs) == 3 and all(row["n"] > 0 and row["ci_low"] <= row["accuracy"] <= row["ci_high"] for row in fs)
    assert isinstance(cmp["verdict"]["claim_held"], bool) and cmp["verdict"]["statement"]
    v = cmp["verdict"]
    assert v["verdict"] in ("targeted better", "no difference", "targeted worse")
    assert v["seeds"]["stage2_targeted"] == v["seeds"]["stage2_random"] == [0, 1, 2]
    assert v["targeted_minus_random_failure_slices"]["seeds"] == [3, 3]
