"""The roofline cost model (sim/roofline.py) against hand computation, and the GPU calibration
override."""

import json
import math
import random

import pytest

from sim.roofline import (CALIBRATION_SCHEMA, H20, H800, MODELS, QWEN25_0_5B, QWEN25_1_5B, QWEN25_7B, Calibration,
                          DecodeRun, Roofline)


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"])
def test_parameter_count_matches_transformers(name):
    torch = pytest.importorskip("torch")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    m = MODELS[name]
    cfg = Qwen2Config(vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.intermediate,
                      num_hidden_layers=m.layers, num_attention_heads=m.heads, num_key_value_heads=m.kv_heads,
                      tie_word_embeddings=m.tie_embeddings)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == m.params


def test_published_sizes_and_kv_bytes():
    # Qwen2.5 model cards: 0.49B, 1.54B, 7.61B parameters
    assert round(QWEN25_0_5B.params / 1e9, 2) == 0.49
    assert round(QWEN25_1_5B.params / 1e9, 2) == 1.54
    assert 7.61e9 <= QWEN25_7B.params < 7.62e9
    # K and V x 28 layers x 4 KV heads x 128 dims x 2 bytes
    assert QWEN25_7B.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57344
    assert QWEN25_0_5B.kv_bytes_per_token == 2 * 24 * 2 * 64 * 2


def test_decode_of_a_7b_model_at_batch_1_is_bandwidth_bound():
    r = Roofline(H800, QWEN25_7B)
    bw = H800.hbm_bytes_s * H800.bandwidth_efficiency            # 3.35 TB/s x 0.7
    ctx = 1000
    t = r.decode_step_s(1, ctx)
    # weights (blocks + LM head, bf16) + the KV cache of 1,001 tokens, read once, plus the step overhead
    expected = (QWEN25_7B.weight_bytes + QWEN25_7B.kv_bytes_per_token * (ctx + 1)) / bw + H800.step_overhead_s
    assert t == pytest.approx(expected, rel=1e-12)
    # ~ 2 bytes x 7.07e9 matmul parameters / bandwidth: ~6 ms + 3 ms overhead
    assert (t - H800.step_overhead_s) == pytest.approx(2 * 7.07e9 / bw, rel=0.01)
    flops_s = (2 * (QWEN25_7B.body_matmul_params + QWEN25_7B.head_params) + 4 * 28 * 28 * 128 * ctx) / (
        H800.peak_flops * H800.compute_efficiency)
    assert flops_s < (t - H800.step_overhead_s) / 50                  # far from compute-bound


def test_prefill_is_compute_bound_and_h20_prefills_slower_but_decodes_faster():
    r8, r20 = Roofline(H800, QWEN25_7B), Roofline(H20, QWEN25_7B)
    n = 4096
    flops = 2 * QWEN25_7B.body_matmul_params * n + 2 * QWEN25_7B.head_params + 4 * 28 * 28 * 128 * n * (n + 1) / 2
    assert r8.prefill_s(1, n) == pytest.approx(flops / (989.5e12 * 0.5) + 3e-3, rel=1e-12)
    assert r20.prefill_s(1, n) / r8.prefill_s(1, n) > 5                 # 148 vs 989.5 TFLOP/s
    assert r20.decode_step_s(8, 2000) < r8.decode_step_s(8, 2000)        # 4.0 vs 3.35 TB/s


def test_decode_run_closed_form_equals_the_step_sum_and_inverts():
    r = Roofline(H800, QWEN25_7B)
    for a, s in ((1, 100), (16, 16 * 3000), (256, 256 * 200)):
        run = r.decode_run(a, s)
        for n in (0, 1, 7, 500):
            ref = sum(r.decode_step_s(a, (s + a * j) / a) for j in range(n))
            assert run.cum_s(n) == pytest.approx(ref, rel=1e-9, abs=1e-12)
    rng = random.Random(1)
    for _ in range(2000):
        run = DecodeRun(rng.uniform(0, 1), rng.uniform(0, 0.01), rng.uniform(0, 1), rng.uniform(-0.001, 0.01),
                        rng.uniform(0, 0.1), rng.uniform(0.5, 2))
        n_max = rng.randint(0, 50)
        e = rng.uniform(0, 1.2 * run.cum_s(n_max) + 1e-9)
        ref = next((n for n in range(n_max + 1) if run.cum_s(n) >= e - 1e-12), n_max)
        assert run.steps_by(e, n_max) == ref


def test_training_flops_and_kv_capacity():
    r = Roofline(H800, QWEN25_7B, extra_forwards=0)
    assert r.train_flops([1]) == pytest.approx(6 * QWEN25_7B.params + 3 * 2 * 28 * 28 * 128, rel=1e-12)
    r1 = Roofline(H800, QWEN25_7B)                                        # + the old-log-prob forward
    assert r1.train_flops([1000]) / r.train_flops([1000]) == pytest.approx(8 / 6, rel=0.01)
    assert r1.train_gpu_s([1000]) == pytest.approx(r1.train_flops([1000]) / (989.5e12 * 0.4))
    cap = (80e9 * 0.9 - 2 * QWEN25_7B.params) // QWEN25_7B.kv_bytes_per_token
    assert r.kv_capacity_tokens() == cap


def _write_cal(path, profile, model, factor, roof):
    pts = {"decode": [], "prefill": []}
    for b in (1, 16):
        for c in (512, 4096):
            pts["decode"].append({"batch": b, "context": c, "seconds": factor * roof.raw_iteration_s(b, b * c)})
            pts["prefill"].append({"batch": b, "context": c,
                                   "seconds": factor * roof.raw_iteration_s(0, 0.0, [(c, 0.0)] * b)})
    path.write_text(json.dumps({"schema": CALIBRATION_SCHEMA, "device": {"profile": profile},
                                "models": {model: pts}}))


def test_calibration_overrides_the_roofline_where_it_applies(tmp_path):
    base = Roofline(H800, QWEN25_7B)
    p = tmp_path / "cal.json"
    _write_cal(p, "h800", "qwen2.5-7b", 2.0, base)
    cal = Calibration.load(p)
    r = Roofline(H800, QWEN25_7B, calibration=cal)
    assert r.calibrated
    # at a measured point the measured time, between points the roofline's shape x the measured ratio
    assert r.decode_step_s(16, 4096) == pytest.approx(2 * base.decode_step_s(16, 4096), rel=1e-9)
    assert r.decode_step_s(4, 1500) == pytest.approx(2 * base.decode_step_s(4, 1500), rel=1e-6)
    assert r.prefill_s(1, 512) == pytest.approx(2 * base.prefill_s(1, 512), rel=1e-9)
    assert r.decode_run(8, 8 * 2000).cum_s(100) == pytest.approx(2 * base.decode_run(8, 8 * 2000).cum_s(100), rel=1e-6)
    # another GPU, another model or tensor parallelism: the calibration does not apply
    assert not Roofline(H20, QWEN25_7B, calibration=cal).calibrated
    assert not Roofline(H800, QWEN25_0_5B, calibration=cal).calibrated
    assert not Roofline(H800, QWEN25_7B, tp=2, calibration=cal).calibrated


def test_a_measured_point_that_differs_from_the_roofline_is_returned_exactly(tmp_path):
    base = Roofline(H800, QWEN25_7B)
    p = tmp_path / "cal.json"
    _write_cal(p, "h800", "qwen2.5-7b", 1.0, base)
    d = json.loads(p.read_text())
    d["models"]["qwen2.5-7b"]["decode"][0]["seconds"] = 0.031        # batch 1, context 512: measured 31 ms
    p.write_text(json.dumps(d))
    r = Roofline(H800, QWEN25_7B, calibration=Calibration.load(p))
    assert r.decode_step_s(1, 512) == pytest.approx(0.031, rel=1e-9)
    assert r.decode_step_s(16, 4096) == pytest.approx(base.decode_step_s(16, 4096), rel=1e-9)


def test_a_malformed_calibration_names_the_field(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"schema": CALIBRATION_SCHEMA, "device": {"profile": "h800"},
                             "models": {"qwen2.5-7b": {"decode": [{"batch": 1, "context": 512, "seconds": -1}]}}}))
    with pytest.raises(ValueError, match=r"models\.qwen2\.5-7b\.decode\[0\]\.seconds"):
        Calibration.load(p)
    p.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ValueError, match="schema"):
        Calibration.load(p)
    assert math.isfinite(Roofline(H800, QWEN25_7B).decode_step_s(1, 1))
