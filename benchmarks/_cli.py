"""The command-line frame the benchmark scripts share: the parser (description from the script's
docstring, ``--out`` under ``benchmarks/results``, the common ``--seeds`` and ``--quick``), the
command line a results JSON records, reading and writing that JSON, and reading a JSON-lines file
(``jsonl_records``).

A script puts the repository root on ``sys.path`` (it runs as ``python benchmarks/<name>.py``) and
imports from here::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks._cli import RESULTS, bench_parser, command_line, write_results  # noqa: E402

    ap = bench_parser(__doc__, "decontam.json", seeds=3, quick="a smoke run")
    args = ap.parse_args(argv)
    result = {"command": command_line(__file__, argv), ...}
    write_results(result, args.out)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def bench_parser(doc: Optional[str] = None, out: Optional[str] = None, *, seeds: Optional[int] = None,
                 seeds_help: str = "seeds (runs per method)", quick: Optional[str] = None,
                 full_doc: bool = False, out_help: str = "results JSON (default: %(default)s)") -> argparse.ArgumentParser:
    """An ``ArgumentParser`` for a benchmark script.

    Args:
        doc: the script's ``__doc__``; the description is its first paragraph (``full_doc``: all of
            it, line breaks kept). None: no description.
        out: a results file name: adds ``--out`` (default ``benchmarks/results/<out>``, a str;
            ``out_help``). None: no ``--out`` (the script adds its own, e.g. one off by default).
        seeds: adds ``--seeds`` (int, this default, ``seeds_help``).
        quick: adds the flag ``--quick`` with this help (the script's quickest settings).
    """
    if doc is None:
        ap = argparse.ArgumentParser()
    elif full_doc:
        ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        ap = argparse.ArgumentParser(description=doc.strip().split("\n\n")[0])
    if out is not None:
        ap.add_argument("--out", default=str(RESULTS / out), help=out_help)
    if seeds is not None:
        ap.add_argument("--seeds", type=int, default=seeds, help=seeds_help)
    if quick is not None:
        ap.add_argument("--quick", action="store_true", help=quick)
    return ap


def add_table_sizes(ap: argparse.ArgumentParser, *, rows: int, repeats: int, small_tables: int,
                    small_rows: int = 100) -> argparse.ArgumentParser:
    """Add the table sizes of a lake benchmark to ``ap`` (the local and the object-store lake
    benchmarks take the same four): ``--rows`` (rows of the one large table), ``--repeats`` (timed
    calls per median), ``--small-rows`` and ``--small-tables`` (the demo path: that many first-time
    writes of tables that small); all ints, these defaults. Returns ``ap``."""
    ap.add_argument("--rows", type=int, default=rows, help="rows of the large table (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=repeats, help="timed calls per median (default: %(default)s)")
    ap.add_argument("--small-rows", type=int, default=small_rows, help="rows of each small table (default: %(default)s)")
    ap.add_argument("--small-tables", type=int, default=small_tables,
                    help="small tables written and read (default: %(default)s)")
    return ap


def command_line(script: str | Path, argv: Optional[Sequence[str]] = None, env: str = "") -> str:
    """The command that reproduces this run, as a results JSON records it:
    ``[<env> ].venv/bin/python benchmarks/<name>.py <args>``.

    Args:
        script: the script's ``__file__``.
        argv: the arguments ``main`` was given; None: ``sys.argv[1:]``.
        env: environment assignments it needs, e.g. ``"OMP_NUM_THREADS=1"``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    rel = Path(script).resolve().relative_to(ROOT).as_posix()
    return " ".join(([env] if env else []) + [".venv/bin/python", rel] + args)


def previous_results(path: str | Path) -> dict:
    """The results JSON at ``path`` ({} when there is none): a script that runs one section keeps
    the others' last figures."""
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else {}


def jsonl_records(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, dict]]:
    """(line number from 1, record) for every non-blank line of the JSON-lines file ``path`` (UTF-8),
    in order.

    Raises:
        FileNotFoundError: no file at ``path``.
        ``error`` (ValueError unless the caller names its own): a line that is not JSON, or not a
            JSON object; the message names the file and the line.
    """
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{path}:{n}: not a JSON line ({e})") from e
        if not isinstance(rec, dict):
            raise error(f"{path}:{n}: a line must be a JSON object, got {type(rec).__name__}")
        yield n, rec


def write_results(result: dict, path: str | Path, indent: int = 1, default: Callable = str) -> Path:
    """Write ``result`` to ``path`` as JSON, atomically (``ops.lake.write_json_atomic``), keys in the
    order the script built them; ``default`` turns other values into JSON (``str``; ``float`` keeps
    numpy scalars as numbers). Returns the path."""
    from ops.lake import write_json_atomic

    write_json_atomic(result, path, indent=indent, sort_keys=False, default=default)
    return Path(path)


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls (``time.perf_counter``), in ms, rounded to 0.1.
    Raises ValueError when ``repeats`` < 1."""
    import statistics
    import time

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return round(1000 * statistics.median(ts), 1)
