"""Dedup beyond one machine (docs/curation.md, "Beyond one machine"): shards as Dagster partitions plus one
global LSH merge give the single-machine tables row for row."""

import random

import dagster as dg
import polars as pl

from assets import curation, curation_sharded
from assets.curation import PROBLEM_SCHEMA
from assets.frames import frame
from ops.curation import sources
from ops.curation.annotate import annotate
from ops.curation.shard import band_keys, collision_components, colliding_rows, key_table, shard_of
from ops.curation.text import stable_id, text_hash
from resources.lake import LakeResource

ASSETS = [curation.exact_deduped_problems, curation.near_deduped_problems, curation_sharded.dedup_shards,
          curation_sharded.near_dedup_merge]


def _corpus() -> list[dict]:
    """600 real MATH test problems, 150 near-copies (one word dropped) and 60 exact copies (upper case) of them."""
    rng = random.Random(0)
    real = sources.math_test()[:600]
    rows = list(real)
    long = [r for r in real if len(r["problem"].split()) >= 25]
    for i, r in enumerate(rng.sample(long, 150)):
        words = r["problem"].split(" ")
        del words[rng.randrange(1, len(words))]
        rows.append({**r, "source": "copies", "record": f"near/{i}", "problem": " ".join(words)})
    for i, r in enumerate(rng.sample(real, 60)):
        rows.append({**r, "source": "copies", "record": f"exact/{i}", "problem": r["problem"].upper(), "solution": None})
    for r in rows[600:]:
        r["problem_id"] = stable_id(r["source"], r["record"], r["problem"])
    return rows


def test_sharded_dedup_equals_the_single_machine_tables(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    rows, _ = annotate(_corpus())
    lake.write(frame(rows, PROBLEM_SCHEMA).sort("problem_id"), "annotated_problems")
    res = dg.materialize(ASSETS, selection=["exact_deduped_problems", "near_deduped_problems", "dedup_clusters"],
                         resources={"lake": lake})
    assert res.success
    for key in curation_sharded.DEDUP_SHARDS.get_partition_keys():  # one run per shard, as a deployment launches them
        assert dg.materialize(ASSETS, selection=["dedup_shards"], partition_key=key, resources={"lake": lake}).success
    res = dg.materialize(ASSETS, selection=["near_deduped_problems_sharded", "dedup_clusters_sharded"], resources={"lake": lake})
    assert res.success
    single, sharded = lake.read("near_deduped_problems"), lake.read("near_deduped_problems_sharded")
    clusters, sharded_clusters = lake.read("dedup_clusters"), lake.read("dedup_clusters_sharded")
    assert single.equals(sharded) and clusters.equals(sharded_clusters)
    # not a vacuous equality: both stages removed rows, and the merge verified only a part of the corpus
    by_stage = dict(clusters.group_by("stage").len().rows())
    assert by_stage["exact"] >= 50 and by_stage["near"] >= 100
    assert single.height == 810 - by_stage["exact"] - by_stage["near"]
    shard_sizes = [lake.read("dedup_shards", k).height for k in curation_sharded.DEDUP_SHARDS.get_partition_keys()]
    assert len(shard_sizes) == curation_sharded.N_SHARDS and min(shard_sizes) > 0
    meta = res.asset_materializations_for_node("near_dedup_merge")[0].metadata
    assert meta["colliding_rows"].value < single.height / 2


def test_exact_duplicates_share_a_shard_and_collisions_split_into_components():
    texts = ["Find $x$ if $2x + 3 = 7$ and $x$ is an integer.", "FIND $x$ if $2x + 3 = 7$  and $x$ is an integer.",
             "What is the remainder when 1234 is divided by 7 and then by 3?"]
    md5 = pl.Series([text_hash(t) for t in texts])
    s = shard_of(md5, 5)
    assert s[0] == s[1] and 0 <= s.min() and s.max() < 5
    keys = band_keys(texts)
    assert keys.shape == (3, 16) and (keys[0] == keys[1]).all() and not (keys[0] == keys[2]).any()
    groups = colliding_rows([key_table(["a", "b", "c"], keys)])
    assert set(groups["problem_id"].to_list()) == {"a", "b"}
    comp = collision_components(pl.concat([groups, pl.DataFrame({"group": [99, 99], "problem_id": ["x", "y"]},
                                                                 schema=groups.schema)]))
    assert comp.rows() == [("a", 0), ("b", 0), ("x", 1), ("y", 1)]
