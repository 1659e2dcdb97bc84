"""Object-store lake benchmark: commit and read latency of one table on a local root (rename) and on
an S3-compatible server on loopback (moto's server mode; objects, then the manifest), docs/operations.md,
"Lake on object storage".

    .venv/bin/python benchmarks/lake_s3_bench.py            # -> benchmarks/results/lake_s3.json

Real measurements, but of moto (a Python server on 127.0.0.1), not of AWS S3: a real store adds the
network round trips (a commit makes five requests: PUT, HEAD, manifest GET and PUT, one LIST).
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import bench_parser, write_results  # noqa: E402


def main() -> None:
    ap = bench_parser(__doc__, "lake_s3.json")
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()

    import boto3
    import polars as pl
    from moto.server import ThreadedMotoServer

    from resources.lake import LakeResource

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(k, "bench")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench-lake")
        with tempfile.TemporaryDirectory() as d:
            lakes = {"local": LakeResource(root=f"{d}/local"),
                     "s3_moto_loopback": LakeResource(root="s3://bench-lake/lake", endpoint_url=endpoint,
                                                      region="us-east-1", work_dir=d)}
            df = pl.DataFrame({"i": range(a.rows), "s": [f"problem {i}" for i in range(a.rows)]})
            out = {"rows": a.rows, "repeats": a.repeats, "label": "real (moto on loopback, not AWS)"}
            for name, lake in lakes.items():
                w, r = [], []
                for _ in range(a.repeats):
                    t = time.perf_counter()
                    lake.write(df, "t", refresh=False)
                    w.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    assert lake.read("t").height == a.rows
                    r.append(time.perf_counter() - t)
                out[name] = {"commit_ms_median": round(1000 * statistics.median(w), 1),
                             "read_ms_median": round(1000 * statistics.median(r), 1)}
    finally:
        server.stop()
    write_results(out, a.out)
    print(out)


if __name__ == "__main__":
    main()
