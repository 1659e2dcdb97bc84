"""Process measurements the benchmark scripts share (psutil).

``process_tree_rss`` is the one place that sums the resident memory of a process and all its
descendants: the dedup claims' memory cap (``benchmarks/claims/adapters/dedup.py``) and the curation
scale benchmark's tree peak (``benchmarks/curation_scale.py``) both read it.
"""

from __future__ import annotations


def process_tree_rss(pid: int) -> tuple[int, int]:
    """Resident set size summed over process ``pid`` and every descendant (psutil's
    ``memory_info().rss``), read once.

    Returns:
        (bytes, processes counted). A descendant that exits while it is being read is left out of
        both numbers.
    Raises:
        psutil.NoSuchProcess / psutil.AccessDenied (``psutil.Error``): ``pid`` itself is gone or
        cannot be read.
    """
    import psutil

    root = psutil.Process(pid)
    total = counted = 0
    for p in [root] + root.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            if p is root:
                raise
            continue
        counted += 1
    return total, counted
