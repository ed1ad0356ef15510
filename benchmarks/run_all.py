"""Reproduce the README's benchmark table: every example model, five engines, one table.

    .venv/bin/python benchmarks/run_all.py                  # 2 threads, batch 1, about a minute
    .venv/bin/python benchmarks/run_all.py --json all.json --profile

Builds (or reads from the zoo cache) the quantized QDQ version of every small zoo model and of
resnet50, runs `qfuse bench`'s method on each (compiler/bench.py: same inputs, same threads,
interleaved rounds) for qfuse fused, unfused, fp32, ONNX Runtime and OpenVINO, and prints one
table: fused median latency and every other engine's latency as a multiple of fused (> 1 means
slower than fused), the lowest cosine similarity of any engine's outputs to fused's, and the
fused compile time, and `busy`: the share of CPU time other processes took while that model was
timed (a shared machine: rerun when it is not ~0). `--profile` adds the per-kernel profile of resnet50's fused plan.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qfuse.compiler.bench import BenchConfig, BenchResult, run_bench
from qfuse.examples import zoo

OTHERS = ["unfused", "fp32", "onnxruntime", "openvino"]
SHORT = {"unfused": "unfused/f", "fp32": "fp32/f", "onnxruntime": "ort/f", "openvino": "ov/f"}


def _row(name: str, result: BenchResult) -> dict[str, Any]:
    fused = result.engines["fused"]
    row: dict[str, Any] = {"model": name, "fused_ms": fused.median_ms,
                           "compile_s": fused.compile_s}
    for other in OTHERS:
        stats = result.engines.get(other)
        row[other] = stats.ratio if stats else None
    cosines = {n: s.cosine for n, s in result.engines.items()
               if n not in ("fused", "fp32") and s.cosine is not None}
    row["min_cosine"] = min(cosines.values()) if cosines else None
    ov = result.engines.get("openvino")
    row["openvino_int8"] = (f"{ov.info['compute_int8']}/{ov.info['compute_layers']}"
                            if ov else None)
    row["others_cpu"] = result.others_cpu
    return row


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def format_rows(rows: list[dict[str, Any]], threads: int, batch: int) -> str:
    lines = [(f"qfuse benchmark: {threads} threads, batch {batch}; ratios are engine latency"
              " / qfuse fused latency (median; > 1: slower than fused)"),
             f"{'model':<12} {'fused ms':>9} " + " ".join(f"{SHORT[o]:>9}" for o in OTHERS)
             + f" {'compile s':>9} {'min cos':>8} {'ov int8':>8} {'busy':>5}"]
    for row in rows:
        lines.append(f"{row['model']:<12} {row['fused_ms']:>9.3f} "
                     + " ".join(f"{_fmt(row[o], '.2f'):>9}" for o in OTHERS)
                     + f" {row['compile_s']:>9.2f} {_fmt(row['min_cosine'], '.5f'):>8}"
                     + f" {row['openvino_int8'] or '-':>8} {_percent(row['others_cpu']):>5}")
    means = []
    for other in OTHERS:
        values = [r[other] for r in rows if r[other]]
        means.append(math.exp(sum(map(math.log, values)) / len(values)) if values else None)
    lines.append(f"{'geomean':<12} {'':>9} " + " ".join(f"{_fmt(m, '.2f'):>9}" for m in means))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join([*zoo.SMALL_ARCHITECTURES, "resnet50"]))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iters", type=int, default=200, help="timed runs per engine")
    parser.add_argument("--json", type=Path, help="write every number (per model, per engine)")
    parser.add_argument("--profile", action="store_true",
                        help="also print the per-kernel profile of resnet50's fused plan")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    results: dict[str, Any] = {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        print(f"{name}: building / benchmarking ...", file=sys.stderr, flush=True)
        path = zoo.model_path(name, quantized=True)
        config = BenchConfig(path, OTHERS, args.threads, args.iters, args.batch, progress=True)
        result = run_bench(config)
        rows.append(_row(name, result))
        for engine, reason in result.skipped.items():
            print(f"  {name}: skipped {engine}: {reason}", file=sys.stderr)
        if args.profile and name == "resnet50":
            from qfuse.compiler.bench_profile import profile_model

            result.profile = profile_model(result.compiled, Path(result.model_used),
                                           result.threads, runs=args.iters)
        results[name] = result.to_json()
    print(format_rows(rows, args.threads, args.batch))
    if args.profile and "resnet50" in results:
        from qfuse.compiler.bench_profile import format_profile

        print()
        print(format_profile(results["resnet50"]["profile"]))
    print(f"(total {time.perf_counter() - start:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "batch": args.batch,
                                         "rows": rows, "results": results}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
