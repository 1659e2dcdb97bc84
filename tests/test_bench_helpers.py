"""The helpers the benchmark scripts share: ``benchmarks._proc.process_tree_rss`` on a real process
tree and its two callers (the dedup claims' memory cap, the curation scale benchmark's tree sampler);
``benchmarks._cli.jsonl_records`` and its two callers (the claims runner's log, verify_bench's pairs)."""

import subprocess
import sys
import time

import psutil
import pytest

from benchmarks._proc import process_tree_rss

MIB = 2**20

# a child that holds 120 MiB and starts a grandchild holding 80 MiB, then says "ready" and waits
TREE = r"""
import subprocess, sys
held = bytearray(120 * 2**20)
held[::4096] = b"x" * len(held[::4096])
g = subprocess.Popen([sys.executable, "-c",
    "import sys; b = bytearray(80 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); sys.stdin.read()"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert g.stdout.readline().strip() == "ready"
print("ready", flush=True)
sys.stdin.read()
g.stdin.close()
g.wait(timeout=30)
"""


@pytest.fixture
def tree():
    p = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        yield p
    finally:
        p.stdin.close()
        p.wait(timeout=30)


def test_tree_rss_sums_the_process_and_its_descendants(tree):
    total, procs = process_tree_rss(tree.pid)
    assert procs == 2
    own = psutil.Process(tree.pid).memory_info().rss
    assert own > 120 * MIB                                   # the child alone holds 120 MiB
    assert total > own + 80 * MIB                            # plus the grandchild's 80 MiB
    assert total < 400 * MIB


def test_a_gone_process_raises_and_the_dedup_cap_reads_zero():
    from benchmarks.claims.adapters.dedup import _tree_rss_bytes

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=30)
    with pytest.raises(psutil.NoSuchProcess):
        process_tree_rss(p.pid)
    assert _tree_rss_bytes(p.pid) == 0


def test_the_dedup_cap_and_the_curation_sampler_read_the_tree(tree):
    from benchmarks.claims.adapters.dedup import _tree_rss_bytes
    from benchmarks.curation_scale import TreeSampler

    assert _tree_rss_bytes(tree.pid) > 200 * MIB
    s = TreeSampler(tree.pid, every=0.05)
    deadline = time.monotonic() + 10
    while s.peak == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    s.stop()
    assert s.peak > 200 * MIB and s.peak_procs == 2


def test_jsonl_records_skips_blank_lines_and_names_the_bad_line(tmp_path):
    from benchmarks._cli import jsonl_records

    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n\n  \n{"a": 2}\n')
    assert list(jsonl_records(p)) == [(1, {"a": 1}), (4, {"a": 2})]
    p.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(ValueError, match=r"x\.jsonl:2: not a JSON line"):
        list(jsonl_records(p))
    p.write_text('{"a": 1}\n\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"x\.jsonl:3: a line must be a JSON object, got list"):
        list(jsonl_records(p))


def test_the_claims_log_and_the_verify_pairs_read_through_jsonl_records(tmp_path):
    from benchmarks.claims.runner import ClaimError, read_log
    from benchmarks.verify_bench import load_pairs

    assert read_log(tmp_path / "absent.jsonl") == []
    log = tmp_path / "claim.jsonl"
    log.write_text('{"seed": 1000}\n"a string"\n')
    with pytest.raises(ClaimError, match=r"claim\.jsonl:2: a line must be a JSON object"):
        read_log(log)
    log.write_text('{"seed": 1000}\n\n{"seed": 1001}\n')
    assert [r["seed"] for r in read_log(log)] == [1000, 1001]
    pairs = tmp_path / "pairs.jsonl"
    good = '{"id": "a", "gold": "1", "pred": "1.0", "equivalent": true, "style": "decimal", "source": "t"}'
    pairs.write_text(good + "\n\n" + good.replace('"id": "a"', '"id": "b"').replace("true", '"yes"') + "\n")
    with pytest.raises(ValueError, match=r"pairs\.jsonl:3: field 'equivalent' missing or not bool \(record 'b'\)"):
        load_pairs(pairs)
    pairs.write_text(good + "\n[]\n")
    with pytest.raises(ValueError, match=r"pairs\.jsonl:2: a line must be a JSON object"):
        load_pairs(pairs)
    pairs.write_text(good + "\n")
    assert [r["id"] for r in load_pairs(pairs)] == ["a"]


def test_median_ms_is_the_median_of_the_calls_in_ms():
    """The lake benchmarks' timer: the median of the calls, not the mean (one slow call of three does
    not move it), in ms; repeats < 1 is refused."""
    import time

    from benchmarks._cli import median_ms

    delays = iter([0.0, 0.2, 0.0])
    assert median_ms(lambda: time.sleep(next(delays)), 3) < 50
    assert 15 <= median_ms(lambda: time.sleep(0.02), 3) < 150
    with pytest.raises(ValueError, match="repeats"):
        median_ms(lambda: None, 0)


def test_add_table_sizes_and_the_two_lake_benchmarks_that_use_it():
    """The lake benchmarks' four table sizes come from ``add_table_sizes``: each script's own
    defaults, overridable, and its --help (a real run of the script) names them."""
    from pathlib import Path

    from benchmarks._cli import add_table_sizes, bench_parser

    ap = add_table_sizes(bench_parser(None), rows=10, repeats=3, small_tables=4)
    a = ap.parse_args(["--small-rows", "7"])
    assert (a.rows, a.repeats, a.small_rows, a.small_tables) == (10, 3, 7, 4)
    root = Path(__file__).resolve().parents[1]
    for script, defaults in (("lake_s3_bench.py", ("10000", "10", "20")), ("lake_local_bench.py", ("100000", "7", "40"))):
        out = subprocess.run([sys.executable, str(root / "benchmarks" / script), "--help"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
        for opt, default in zip(("--rows", "--repeats", "--small-tables"), defaults):
            assert f"{opt} " in out and f"(default: {default})" in out, (script, opt, out)
        assert "(default: 100)" in out                    # --small-rows
