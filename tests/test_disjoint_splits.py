"""Train/eval disjointness by CONTENT (issue 38, item 2; docs/claims.md, "Train/eval disjointness").

Every evaluation set of the project is compared with the training data it judges by what a model
sees — prompt text, (user, item, time) rows, document text — never by ids:

* RL (docs/rl_policy.md, "Splits"): the held-out and generalisation sets of the scratchpad task
  against every training stream: the SFT warm start's rows, the 240-step GRPO stream of
  ``benchmarks/rl_gain.py``, the RollPacker runs (asset default and ``benchmarks/rl_real.py``) and the
  RollArc tasks (asset default);
* post-training (docs/posttrain.md): the evaluation table against the stage-1 training set, the
  synthesis pool and both stage-2 arms' sets;
* the CTR split (docs/sparse.md): MovieLens-100k train vs test events;
* D-CPT (docs/mixture.md): the general corpus's train vs validation reviews.

Fast: no model is trained (the streams are drawn, not run); about 20 s in all, most of it the
post-training generator.
"""

import random

import polars as pl
import pytest

from ops.rl import scratchpad as sp


def _held(seed: int, n: int = 256) -> dict[str, set[str]]:
    return {s: {p.prompt for p in sp.problems(seed, n, split=s)} for s in ("heldout", "generalisation")}


def _assert_disjoint(train: set[str], evals: dict[str, set[str]], what: str) -> None:
    for split, texts in evals.items():
        both = sorted(train & texts)
        assert not both, f"{what}: {len(both)} {split} prompts appear verbatim in training, e.g. {both[:3]}"


# ------------------------------------------------------------------------------------------ RL streams

def test_the_problem_space_is_partitioned_by_content():
    """2,640 prompts; every prompt in exactly one split; generalisation = unseen quotients; every
    (divisor, quotient) cell outside them keeps a - 1 training prompts and holds out one."""
    space = sp.space()
    assert len(space) == len({(a, n) for a, n, _ in space}) == 2640
    by = {s: {(a, n) for a, n, t in space if t == s} for s in sp.SPLITS}
    assert [len(by[s]) for s in sp.SPLITS] == [1872, 416, 352]
    assert {n // a for a, n in by["generalisation"]} == set(sp.GENERALISATION_QUOTIENTS)
    assert not {n // a for a, n in by["train"] | by["heldout"]} & set(sp.GENERALISATION_QUOTIENTS)
    for a in sp.DIVISORS:
        for q in (1, 2, 30, 60):
            cell = [sp.split_of(a, q * a + r) for r in range(a)]
            assert cell.count("heldout") == 1 and cell.count("train") == a - 1
    # a sampled problem always lies in the split it was drawn from
    rng = random.Random(0)
    for s in sp.SPLITS:
        assert all(sp.split_of(p.a, p.n) == s for p in (sp.sample_problem(rng, "x", split=s) for _ in range(500)))
    with pytest.raises(ValueError, match="scratchpad.split"):
        sp.problems(0, 1, split="test")
    with pytest.raises(ValueError, match="no quotient in \\[1, 6\\]"):
        sp.problems(0, 1, max_lines=6, split="generalisation")


def test_warm_start_rows_never_hold_an_evaluation_prompt():
    """The SFT warm start's training rows, every step up to its ``max_steps`` (1,000 x 32; the default
    stops at ~525), hold no held-out, generalisation or RL-evaluation prompt. Steps 0-99 are decoded
    from ``ProblemBatches.take`` (prompts ``a:N=`` single-turn, ``a:N?`` multi-turn); the rest replay
    ``ProblemBatches.row``'s draws without tokenizing, and the decoded steps check the replay."""
    from ops.rl.warmstart import ProblemBatches, WarmStartSpec

    tok = sp.build_tokenizer()
    chars = {i: ch for ch, i in tok.get_vocab().items()}
    spec = WarmStartSpec(out_dir="unused")
    batches = ProblemBatches(tok, spec)

    def replay(step: int) -> list[str]:
        rng = random.Random(f"warmstart:{spec.seed}:{step}")
        out = []
        for i in range(spec.batch_problems):
            out.append(sp.sample_problem(rng, "x", spec.max_lines, spec.alpha, split="train").prompt)
            rng.random()                                     # row(): single- or multi-turn
        return out

    seen = set()
    for step in range(spec.max_steps):
        prompts = replay(step)
        if step < 100:
            decoded = []
            for row in batches.take(step)[0].tolist():
                text = "".join(chars[t] for t in row[:8])
                decoded.append(text[:min(i for i in (text.find("="), text.find("?")) if i >= 0)] + "=")
            assert decoded == prompts, step
        seen.update(prompts)
    assert len(seen) > 1800                                  # nearly the whole training split (1,872)
    assert all(sp.split_of(*map(int, p[:-1].split(":"))) == "train" for p in seen)
    evals = {**_held(spec.eval_seed, spec.eval_size),
             "final": {p.prompt for p in sp.problems(spec.final_eval_seed, spec.final_eval_size, split="heldout")}}
    _assert_disjoint(seen, evals, "warm start")
    for seed in (0, 1, 2, 1000, 1001, 1002):                # the warm start is grpo-gain's control arm
        _assert_disjoint(seen, _held(seed + 1000), f"warm start vs RL held-out of task seed {seed}")


def test_grpo_gain_stream_and_its_heldout_sets_are_disjoint():
    """The 240-step GRPO stream of benchmarks/rl_gain.py (8 prompts a step) for seeds 0-2 and the
    registered fresh seeds: before the split, 200 of 256 held-out prompts were training prompts."""
    from benchmarks.rl_gain import eval_sets, grpo_spec
    from ops.rl.rollpacker.driver import heldout_problems, load_prompts

    tok = sp.build_tokenizer()
    for seed in (0, 1, 2, 1000, 1001, 1002, 1003, 1004):
        spec = grpo_spec("unused", 240, 6e-5, seed)
        train = {p.text for p in load_prompts(spec, tok)}
        assert len(load_prompts(spec, tok)) == 240 * 8
        sets = eval_sets(spec)
        assert {p.prompt for p in sets["heldout"]} == {p.prompt for p in heldout_problems(spec)}
        assert len(sets["heldout"]) == len(sets["generalisation"]) == 256
        _assert_disjoint(train, {k: {p.prompt for p in v} for k, v in sets.items()}, f"GRPO seed {seed}")


def test_grpo_gain_refuses_a_warm_start_that_trained_on_the_heldout_prompts(tmp_path):
    """A warm start of recipe 1 drew its rows from the whole space (held-out prompts included):
    benchmarks/rl_gain.py (and the grpo-gain claim's run_seed) refuse it before any run."""
    import json

    from benchmarks.rl_gain import check_policy, run_seed
    from ops.rl.warmstart import RECIPE_VERSION

    with pytest.raises(FileNotFoundError, match="materialize rl_policy"):
        check_policy(str(tmp_path))
    (tmp_path / "metrics.json").write_text(json.dumps({"fingerprint": "old", "recipe_version": 1, "steps": 525}))
    with pytest.raises(ValueError, match="recipe_version 1 < 2"):
        run_seed(1000, ["grpo", "warm_start"], tmp_path / "work", policy=str(tmp_path))
    (tmp_path / "metrics.json").write_text(json.dumps({"fingerprint": "new", "recipe_version": RECIPE_VERSION, "steps": 500}))
    assert check_policy(str(tmp_path)) == {"fingerprint": "new", "recipe_version": 2, "steps": 500}
    with pytest.raises(ValueError, match="grpo-gain arms"):
        run_seed(1000, ["grpo", "baseline"], tmp_path / "work", policy=str(tmp_path))


def test_rollpacker_streams_and_heldout_sets_are_disjoint(tmp_path):
    """The rollpacker_run asset's default scratchpad run and benchmarks/rl_real.py's 12-step runs
    (54 of 256 held-out prompts were training prompts before the split)."""
    from assets.rollpacker import RollPackerRunConfig, spec_from
    from benchmarks.rl_real import SIZES, _spec
    from ops.rl.rollpacker.driver import heldout_problems, load_prompts

    tok = sp.build_tokenizer()
    specs = [spec_from(RollPackerRunConfig(eval_size=256), None, None, tmp_path)]
    specs += [_spec(seed, SIZES["full"], str(tmp_path), ["baseline", "rollpacker"]) for seed in (0, 1, 2)]
    for spec in specs:
        train = {p.text for p in load_prompts(spec, tok)}
        held = {p.prompt for p in heldout_problems(spec)}
        assert train and len(held) > 50
        _assert_disjoint(train, {"heldout": held}, f"RollPacker task seed {spec.task_seed}")


def test_rollarc_tasks_and_heldout_set_are_disjoint(tmp_path):
    """The rollarc_run asset's default scratchpad run: every task (multi-turn ``a:N?``) against its
    held-out problems (``RunSpec.eval_problems``)."""
    from assets.rollarc import RollArcRunConfig, spec_from
    from ops.rl.rollarc.driver import load_tasks

    sp.build_tokenizer(tmp_path)
    spec = spec_from(RollArcRunConfig(eval_size=256), None, None, tmp_path)
    tasks = load_tasks(spec)
    train = {f"{t.spec['a']}:{t.spec['n']}=" for t in tasks}
    held = {f"{a}:{n}=" for _, a, n in spec.eval_problems()}
    assert len(tasks) > 20 and len(held) > 50
    _assert_disjoint(train, {"heldout": held}, "RollArc")


# ------------------------------------------------------------------------------------ the other pairs

def _norm(texts) -> set[str]:
    return {" ".join(str(t).lower().split()) for t in texts if t is not None}


def test_posttrain_evaluation_shares_no_problem_text_with_any_training_set():
    """Failure-driven post-training: the evaluation table (programmatic items, MATH-500 / GSM8K and
    OLMES arithmetic benchmark items, real records) against the stage-1 training set, the stage-2
    synthesis pool (both arms' new items come from it) and the stage-2 sets themselves, by
    normalised problem text (case and whitespace folded)."""
    from ops.curation.sources import benchmark_items
    from ops.posttrain import data
    from ops.posttrain.sets import pool_rows, stage1_sets, stage2_sets

    modules = list(data.TASK_MODULES)
    bench = pl.DataFrame(benchmark_items()).select("benchmark", "item_id", "problem", "answer")
    train, ev = stage1_sets(None, bench, modules, train_per_module=20, eval_per_module=20, train_seed=101,
                            eval_seed=202, benchmark_items=64, arithmetic_items=64)
    pool = pool_rows(modules, per_module=20, seed=303)
    half = pool.height // 2
    arms = stage2_sets({"targeted": pool.head(half), "random": pool.tail(pool.height - half)}, train, 0.5)
    ev_text = _norm(ev["problem"].to_list())
    assert set(ev["slice"].to_list()) >= {"programmatic", "benchmark:math500", "benchmark:gsm8k_test",
                                          "benchmark:basic_arithmetic"}
    for name, texts in [("stage-1 train", train["problem"].to_list()), ("synthesis pool", pool["problem"].to_list()),
                        *((f"stage-2 {arm}", df["problem"].to_list()) for arm, df in arms.items())]:
        both = _norm(texts) & ev_text
        assert not both, f"post-training {name}: {len(both)} evaluation problems in training, e.g. {sorted(both)[:2]}"


def test_ctr_time_split_shares_no_event_and_no_user_item_pair():
    """MovieLens-100k CTR events (the sparse / GBA data): the test set is the latest 20% by time;
    no (user, item, timestamp) row and no (user, item) pair is in both (a user rates a movie once).
    Test users do appear in training (2,953 test events' users were seen): that is the task
    (predict a known user's future clicks), not a leak."""
    from ops.sparse.data import movielens_events, time_split

    e = time_split(movielens_events(), 0.2)
    tr, te = e.filter(pl.col("split") == "train"), e.filter(pl.col("split") == "test")
    assert (tr.height, te.height) == (79_999, 20_001)
    for key in (["user_id", "item_id", "timestamp"], ["user_id", "item_id"]):
        assert tr.select(key).join(te.select(key), on=key).height == 0, key
    assert tr["timestamp"].max() < te["timestamp"].min()


def test_dcpt_general_corpus_validation_reviews_are_not_training_reviews():
    """D-CPT's general corpus (Women's Clothing reviews): the validation documents' text, normalised,
    never equals a training document's (the split is by document id; the data have no duplicate
    review texts across the split)."""
    from ops.mixture.corpus import general_corpus

    g = general_corpus()
    tr = _norm(g.filter(pl.col("split") == "train")["text"].to_list())
    va = _norm(g.filter(pl.col("split") == "val")["text"].to_list())
    assert len(va) > 1000 and len(tr) > 20_000
    assert not tr & va


def test_dcpt_domain_corpus_validation_documents_are_not_training_documents():
    """D-CPT's domain corpus split (``domain_corpus``: by problem-id hash) on real curated-source rows,
    the 5,000 MATH test problems with their worked solutions (raw_problems' ``math_test`` source; the
    pipeline feeds ``decontaminated_problems``, which a test cannot materialize): no validation
    document's text, nor its problem, equals a training one's (496 validation documents)."""
    from ops.curation.sources import math_test
    from ops.mixture.corpus import domain_corpus

    raw = pl.DataFrame(math_test()).with_columns(domain=pl.lit("math"))
    docs = domain_corpus(raw).join(raw.select(pl.col("problem_id").cast(pl.String).alias("doc_id"), "problem"), on="doc_id")
    for col in ("text", "problem"):
        tr = _norm(docs.filter(pl.col("split") == "train")[col].to_list())
        va = _norm(docs.filter(pl.col("split") == "val")[col].to_list())
        assert len(va) == 496 and not tr & va, col
