"""Reproduce the README's benchmark table: every example model, five engines, one table.

    .venv/bin/python benchmarks/run_all.py                  # 2 threads, batch 1, about a minute
    .venv/bin/python benchmarks/run_all.py --json all.json --profile
    .venv/bin/python benchmarks/run_all.py --real           # the real-model zoo (examples/realzoo)

Builds (or reads from the zoo cache) the quantized QDQ version of every small zoo model and of
resnet50, runs `qfuse bench`'s method on each (compiler/bench.py: same inputs, same threads,
interleaved rounds) for qfuse fused, unfused, fp32, ONNX Runtime and OpenVINO, and prints one
table: fused median latency and every other engine's latency as a multiple of fused (> 1 means
slower than fused), the lowest cosine similarity of any engine's outputs to fused's, and the
fused compile time, and `busy`: the share of CPU time other processes took while that model was
timed (a shared machine: rerun when it is not ~0). `--profile` adds the per-kernel profile of resnet50's fused plan.

`--real` benchmarks the real-model zoo instead: every model of examples/realzoo quantized by
quantize_static (QDQ) and by NNCF (`--quantizers` to choose), against unfused, fused-inexact
(qfuse fused with oneDNN's int16-saturating int8 kernels where the CPU has no VNNI, as ONNX
Runtime and OpenVINO run there), ONNX Runtime and OpenVINO with its default precision and with
INFERENCE_PRECISION_HINT f32, the inputs being the zoo's held-out pictures.
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
REAL_OTHERS = ["unfused", "fused-inexact", "onnxruntime", "openvino", "openvino-f32"]
SHORT = {"unfused": "unfused/f", "fp32": "fp32/f", "onnxruntime": "ort/f", "openvino": "ov/f",
         "openvino-f32": "ovf32/f", "fused-inexact": "inexact/f"}


def _row(name: str, result: BenchResult, others: list[str] = OTHERS) -> dict[str, Any]:
    fused = result.engines["fused"]
    row: dict[str, Any] = {"model": name, "fused_ms": fused.median_ms,
                           "compile_s": fused.compile_s}
    for other in others:
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


def format_rows(rows: list[dict[str, Any]], threads: int, batch: int,
                others: list[str] = OTHERS) -> str:
    width = max([12, *(len(r["model"]) for r in rows)])
    lines = [(f"qfuse benchmark: {threads} threads, batch {batch}; ratios are engine latency"
              " / qfuse fused latency (median; > 1: slower than fused)"),
             f"{'model':<{width}} {'fused ms':>9} " + " ".join(f"{SHORT[o]:>9}" for o in others)
             + f" {'compile s':>9} {'min cos':>8} {'ov int8':>8} {'busy':>5}"]
    for row in rows:
        lines.append(f"{row['model']:<{width}} {row['fused_ms']:>9.3f} "
                     + " ".join(f"{_fmt(row[o], '.2f'):>9}" for o in others)
                     + f" {row['compile_s']:>9.2f} {_fmt(row['min_cosine'], '.5f'):>8}"
                     + f" {row['openvino_int8'] or '-':>8} {_percent(row['others_cpu']):>5}")
    means = []
    for other in others:
        values = [r[other] for r in rows if r[other]]
        means.append(math.exp(sum(map(math.log, values)) / len(values)) if values else None)
    lines.append(f"{'geomean':<{width}} {'':>9} "
                 + " ".join(f"{_fmt(m, '.2f'):>9}" for m in means))
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
    parser.add_argument("--real", action="store_true",
                        help="benchmark the real-model zoo (examples/realzoo) instead")
    parser.add_argument("--quantizers", default="qdq,nncf",
                        help="with --real: which quantized versions (qdq, qoperator, nncf)")
    args = parser.parse_args(argv)
    if args.real:
        return _main_real(args)
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


def _main_real(args: argparse.Namespace) -> int:
    from qfuse.examples import realzoo

    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    results: dict[str, Any] = {}
    quantizers = [q.strip() for q in args.quantizers.split(",") if q.strip()]
    for entry in realzoo.models():
        for quantizer in quantizers:
            name = f"{entry.name}.{quantizer}"
            path = entry.quantized.get(quantizer)
            if path is None:
                print(f"{name}: not built ({entry.errors.get(quantizer, 'unknown')})",
                      file=sys.stderr)
                continue
            print(f"{name}: benchmarking ...", file=sys.stderr, flush=True)
            config = BenchConfig(path, REAL_OTHERS, args.threads, args.iters, args.batch,
                                 progress=True, inputs=entry.evaluation[0])
            try:
                result = run_bench(config)
            except Exception as exc:  # noqa: BLE001 - a model qfuse cannot run yet: say so
                print(f"  {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            rows.append(_row(name, result, REAL_OTHERS))
            for engine, reason in result.skipped.items():
                print(f"  {name}: skipped {engine}: {reason}", file=sys.stderr)
            results[name] = result.to_json()
    print(format_rows(rows, args.threads, args.batch, REAL_OTHERS))
    print(f"(inputs: each model's first held-out zoo picture; total "
          f"{time.perf_counter() - start:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "batch": args.batch,
                                         "rows": rows, "results": results}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
