"""Held-out templates: the evaluation items and the stage-2 synthesis pool, generated for real by the
mathematics_dataset generator, share no (module, template) pair; every task module keeps items on
both sides; the OLMES basic-skills arithmetic slice reads real records."""

import collections

import polars as pl
import pytest

from ops.posttrain import data
from ops.posttrain.sets import basic_arithmetic_items, pool_rows, stage1_sets


def test_template_abstracts_numbers_variables_and_lists_but_not_wording():
    t = data.template_of
    assert t("Calculate the greatest common divisor of 91 and 1547.") == t("Calculate the greatest common divisor of 3 and 12.") \
        == "calculate the greatest common divisor of # and #."
    assert t("Which is smaller: -68 or -478/7?") == "which is smaller: # or #?"
    assert t("Which is smaller: 3 or 5?") != t("Which is bigger: 3 or 5?")
    assert t("Solve -33*t = -28*t - 25 for t.") == t("Solve 4*k = -2*k - 0.5 for k.") == "solve #*v = #*v - # for v."
    # list length and option count are instance parameters, not templates
    assert t("What is the closest to 1/3 in 13, 2, -0.2, -2/5?") == t("What is the closest to 4 in 1, 2?")
    assert t("Which is the nearest to 4/9?  (a) -9  (b) -2  (c) -1/4") == t("Which is the nearest to 2?  (a) 1  (b) 5")
    assert data.template_side("numbers__gcd", "x") == data.template_side("numbers__gcd", "x") in data.SIDES


@pytest.fixture(scope="module")
def real_sets():
    """The default task modules at small counts: the stage-1 sets and the synthesis pool, with the
    assets' default seeds (train 101, eval 202, pool 303)."""
    modules = list(data.TASK_MODULES)
    train, ev = stage1_sets(None, None, modules, train_per_module=20, eval_per_module=20, train_seed=101, eval_seed=202)
    pool = pool_rows(modules, per_module=20, seed=303)
    return train, ev, pool


def test_evaluation_and_synthesis_pool_share_no_template(real_sets):
    train, ev, pool = real_sets
    prog = ev.filter(pl.col("slice") == "programmatic")
    pairs = lambda df: set(zip(df["module"].to_list(), df["template"].to_list()))  # noqa: E731
    assert not pairs(prog) & pairs(pool)
    assert all(data.template_side(m, t) == "eval" for m, t in pairs(prog))
    assert set(pool["template_side"].to_list()) == {"synthesis"}
    # the templates really come from the items' text, not from a stored label
    assert all(data.template_of(p) == t for p, t in zip(pool["problem"].to_list(), pool["template"].to_list()))
    # both sides cover every task module, at the requested counts (topped up from extra streams)
    for df in (prog, pool):
        counts = df.group_by("module", "level").len()
        assert set(counts["module"].to_list()) == set(data.TASK_MODULES)
        assert counts["len"].min() == 20 and counts.height == 2 * len(data.TASK_MODULES)
    # stage 1 trains on every template: it includes evaluation-side and synthesis-side ones
    gen = train.filter(pl.col("origin") == "generated")
    sides = {data.template_side(m, t) for m, t in zip(gen["module"].to_list(), gen["template"].to_list())}
    assert sides == {"eval", "synthesis"}
    assert not set(gen["problem"].to_list()) & set(prog["problem"].to_list())


def test_the_split_salt_leaves_every_task_module_on_both_sides():
    rows = data.generated_rows(100, 7)
    by = collections.defaultdict(collections.Counter)
    for r in rows:
        by[r["module"]][r["template_side"]] += 1
    for m in data.TASK_MODULES:
        share = by[m]["eval"] / (by[m]["eval"] + by[m]["synthesis"])
        assert 0.25 <= share <= 0.75, (m, dict(by[m]))


def test_generated_rows_refuses_an_unknown_side():
    with pytest.raises(ValueError, match="side must be one of"):
        data.generated_rows(1, 0, ["numbers__gcd"], side="test")


def test_basic_arithmetic_items_are_real_exact_answer_records():
    items = basic_arithmetic_items(40, seed=0)
    assert items.height == 40 and items["item_id"].n_unique() == 40
    assert items.equals(basic_arithmetic_items(40, seed=0))
    everything = basic_arithmetic_items(10_000, seed=0)
    assert everything.height == 1047  # the whole OLMES basic-skills arithmetic set
    sums = {p: a for p, a in zip(everything["problem"].to_list(), everything["answer"].to_list())}
    assert sums["9 + 5 ="] == "14" and sums["4 * 8 ="] == "32"
    assert all(p.endswith("=") and "\n" not in p for p in everything["problem"].to_list())
    with pytest.raises(ValueError, match="n must be >= 0"):
        basic_arithmetic_items(-1)
