"""``python -m benchmarks.claims <verb>``: list | validate | register | run | summarize | render.

  list                         every design: registered or not, seeds run / planned, verdict
  validate [ID ...]            load every design (or these) and report the first error of each
  register ID [--supersede]    register a committed, unmodified design (then commit registry.json)
  run ID [--seeds S ...]       run registered seeds not yet logged; append to the log; rewrite claims.json
  summarize                    rewrite benchmarks/results/claims.json from the registry and the logs
  render [--check] [FILE ...]  fill the claims tables of README.md and docs/*.md (or FILEs) from claims.json;
                               --check: change nothing, exit 1 when a table differs from the JSON
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.claims.design import DesignError, load_design
from benchmarks.claims.render import RenderError, render_pages
from benchmarks.claims.runner import ClaimError, Layout, read_json, register, run, summarize, write_summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.claims", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    sub.add_parser("list")
    v = sub.add_parser("validate")
    v.add_argument("ids", nargs="*")
    r = sub.add_parser("register")
    r.add_argument("id")
    r.add_argument("--supersede", action="store_true")
    u = sub.add_parser("run")
    u.add_argument("id")
    u.add_argument("--seeds", type=int, nargs="+")
    sub.add_parser("summarize")
    d = sub.add_parser("render")
    d.add_argument("--check", action="store_true")
    d.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args(argv)
    layout = Layout()
    try:
        if args.verb == "list":
            for cid, c in summarize(layout)["claims"].items():
                print(f"{cid:22s} {c['status']:24s} seeds {c['seeds']['run']}/{c['seeds']['planned']}  "
                      f"verdict {c['verdict']}")
        elif args.verb == "validate":
            paths = [layout.designs / f"{i}.yaml" for i in args.ids] or sorted(layout.designs.glob("*.yaml"))
            bad = 0
            for p in paths:
                try:
                    d = load_design(p)
                    print(f"ok      {d.id} ({d.kind}, {len(d.seeds)} seeds, sha256 {d.sha256[:12]})")
                except DesignError as e:
                    bad += 1
                    print(f"INVALID {e}")
            return 1 if bad else 0
        elif args.verb == "register":
            entry = register(args.id, layout, supersede=args.supersede)
            print(json.dumps({args.id: entry}, indent=1))
            print(f"now commit {layout.rel(layout.registry)}")
        elif args.verb == "run":
            for rec in run(args.id, args.seeds, layout):
                print(json.dumps({k: rec[k] for k in ("seed", "arm_order", "status", "wall_s", "metrics")}))
            c = read_json(layout.summary)["claims"][args.id]
            print(f"{args.id}: {c['verdict']} (seeds {c['seeds']['run']}/{c['seeds']['planned']}, "
                  f"estimate {c['estimate']}, ci95 {c['ci95']})")
        elif args.verb == "summarize":
            print(write_summary(layout))
        elif args.verb == "render":
            claims = read_json(layout.summary).get("claims")
            if claims is None:
                raise ClaimError(f"{layout.summary} is missing: python -m benchmarks.claims summarize")
            files = [f.resolve() for f in args.files] or None
            changed = render_pages(layout.root, claims, check=args.check, paths=files)
            for p in changed:
                print(("differs from claims.json: " if args.check else "rendered: ") + str(p))
            if args.check and changed:
                print("run: python -m benchmarks.claims render", file=sys.stderr)
                return 1
    except (ClaimError, DesignError, RenderError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
