"""``python -m qfuse.examples.realzoo build | table [--json] | measure MODEL QUANTIZER``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict

from . import QUANTIZERS, SPECS, cache_dir, models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qfuse.examples.realzoo",
                                     description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="download, extract, render inputs and quantize")
    table = sub.add_parser("table", help="qfuse fused on every model x quantizer")
    for p in (build, table):
        p.add_argument("--models", nargs="+", choices=list(SPECS), default=None)
        p.add_argument("--quantizers", nargs="+", choices=QUANTIZERS, default=list(QUANTIZERS))
    table.add_argument("--json", action="store_true", help="print the rows as JSON")
    table.add_argument("--threads", type=int, default=None)
    table.add_argument("--no-isolate", action="store_true",
                       help="measure in this process (a crash ends the table)")
    measure = sub.add_parser("measure", help="one pair; prints one JSON row")
    measure.add_argument("model", choices=list(SPECS))
    measure.add_argument("quantizer", choices=QUANTIZERS)
    measure.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("qfuse.examples.realzoo").setLevel(logging.INFO)

    if args.command == "build":
        for e in models(args.models, args.quantizers):
            print(f"{e.name}: {e.float_path.name}; " + ", ".join(
                f"{q}: {e.quantized[q].name if q in e.quantized else 'FAILED ' + e.errors[q]}"
                for q in args.quantizers))
        print(f"cache: {cache_dir()}")
        return 0
    from .table import format_table, rows_json
    from .table import measure as measure_one
    from .table import table as run_table

    if args.command == "measure":
        (entry,) = models([args.model], [args.quantizer])
        row = measure_one(entry, args.quantizer, args.threads)
        print(json.dumps(asdict(row)))
        return 0
    rows = run_table(args.models, args.quantizers, args.threads, isolate=not args.no_isolate)
    print(rows_json(rows) if args.json else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
