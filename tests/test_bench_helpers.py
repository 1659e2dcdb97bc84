"""``benchmarks._proc.process_tree_rss`` on a real process tree, and its two callers (the dedup
claims' memory cap and the curation scale benchmark's tree sampler)."""

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
