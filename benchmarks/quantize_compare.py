"""`qfuse quantize` against ONNX Runtime's quantize_static (MinMax and Entropy) on the zoo.

    python benchmarks/quantize_compare.py [--models resnet,unet] [--methods minmax,l2]
                                          [--calib 8] [--held-out 16] [--json OUT]

Every tool gets the same calibration inputs (zoo.sample_inputs, seed 0) and is measured on
held-out inputs (seed 99) with compiler/quantize/evaluate.measure (kernels, kernels a VNNI CPU
runs, "no pass matched" nodes in the quantized region, min / mean cosine of qfuse fused against
the float model in ONNX Runtime), plus the tool's own time. quantize_static runs as examples/zoo/quantize.py calls it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx


def quantize_static(fm: onnx.ModelProto, calib: list[dict[str, np.ndarray]],
                    method: str) -> onnx.ModelProto:
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
    )
    from onnxruntime.quantization import (
        quantize_static as ort_quantize,
    )

    from qfuse.examples.zoo.quantize import ListDataReader, pre_process

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = pre_process(fm, work)
        onnx.save(model, work / "in.onnx")
        ort_quantize(work / "in.onnx", work / "out.onnx", ListDataReader(calib),
                     quant_format=QuantFormat.QDQ, per_channel=True,
                     activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                     calibrate_method=getattr(CalibrationMethod, method))
        return onnx.load(work / "out.onnx")


def main(argv: list[str] | None = None) -> int:

    from qfuse.compiler.quantize import quantize
    from qfuse.compiler.quantize.evaluate import measure
    from qfuse.examples import zoo

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", default=",".join(zoo.SMALL_ARCHITECTURES))
    p.add_argument("--methods", default="minmax,percentile,l2,kl")
    p.add_argument("--calib", type=int, default=8)
    p.add_argument("--held-out", type=int, default=16)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    rows = []
    print(f"{'model':<12} {'tool':<22} {'kernels':>7} {'no-split':>8} {'unmatched':>9} "
          f"{'min cos':>8} {'mean cos':>8} {'time s':>7}")
    for name in args.models.split(","):
        fm = zoo.float_model(name)
        calib = zoo.sample_inputs(fm, args.calib, seed=0)
        held_out = zoo.sample_inputs(fm, args.held_out, seed=99)
        tools = [("quantize_static", m) for m in ("MinMax", "Entropy")]
        tools += [("qfuse quantize", m) for m in args.methods.split(",")]
        for kind, method in tools:
            tool = f"{kind} {method}"
            start = time.perf_counter()
            try:
                model = (quantize_static(fm, calib, method) if kind == "quantize_static"
                         else quantize(fm, calib, method=method))
            except Exception as exc:  # noqa: BLE001 (a tool that fails is a result too)
                print(f"{name:<12} {tool:<22} failed: {exc}")
                rows.append({"model": name, "tool": tool, "error": str(exc)})
                continue
            seconds = time.perf_counter() - start
            m = measure(model, fm, held_out)
            row = {"model": name, "tool": tool, "kernels": m["kernels"],
                   "vnni_kernels": m["vnni_kernels"], "unmatched": len(m["unmatched"]),
                   "min_cos": m["min_cos"], "mean_cos": m["mean_cos"], "seconds": seconds}
            rows.append(row)
            print(f"{name:<12} {tool:<22} {row['kernels']:>7} {row['vnni_kernels']:>8} "
                  f"{row['unmatched']:>9} {row['min_cos']:>8.5f} {row['mean_cos']:>8.5f} "
                  f"{seconds:>7.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
