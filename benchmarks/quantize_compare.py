"""`qfuse quantize` against ONNX Runtime's quantize_static (MinMax and Entropy) on the zoo.

    python benchmarks/quantize_compare.py [--models resnet,unet] [--methods minmax,l2]
                                          [--calib 8] [--held-out 16] [--json OUT]
    python benchmarks/quantize_compare.py --real [--models ppocr_cls,...] [--methods ...]

``--real``: the real-model zoo (examples/realzoo) instead: its 16 calibration inputs for every
tool, its 8 held-out evaluation inputs, and besides quantize_static MinMax (the zoo's ``qdq``
model) and Entropy (run here, as the zoo's quantize.py runs MinMax) also NNCF (the zoo's
``nncf`` model). Each row adds ``agree``: the task's own decision of qfuse fused against the
float model's (realzoo/table.py ``agreement``: top-1, CTC argmax, DB mask IoU, YOLO F1).
``--real-held-out N``: N held-out inputs instead of the zoo's 8 — the spec's own evaluation
inputs (``make_inputs("eval", N)``: the zoo's 8 first, then more from the same held-out
sources), where 8 pictures make a classifier's agreement move in steps of 0.125.
``--bias-correction`` adds a row per qfuse method with ``--bias-correction`` (compiler/quantize/
bias_correction.py), from the same calibration pass.
``--per-tensor-depthwise`` adds a row per qfuse method with the depthwise inputs quantized per
tensor (as before per-channel depthwise inputs, compiler/quantize/placement.py), from the
same calibration pass.

Every tool gets the same calibration inputs (zoo.sample_inputs, seed 0) and is measured on
held-out inputs (seed 99) with compiler/quantize/evaluate.measure (kernels, kernels a VNNI CPU
runs, "no pass matched" nodes in the quantized region, min / mean cosine of qfuse fused against
the float model in ONNX Runtime), plus the tool's own time. quantize_static runs as examples/zoo/quantize.py calls it.
"""

from __future__ import annotations

import argparse
import dataclasses
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


def quantize_static_real(float_path: Path, calib: list[dict[str, np.ndarray]],
                         method: str) -> onnx.ModelProto:
    """quantize_static as examples/realzoo/quantize.py runs it, with ``method`` calibration
    (the realzoo recipe: quant_pre_process, per-channel s8 weights, u8 activations)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
    )
    from onnxruntime.quantization import (
        quantize_static as ort_quantize,
    )

    from qfuse.examples.realzoo.quantize import PER_CHANNEL_QDQ_OPSET, _Reader, pre_process

    with tempfile.TemporaryDirectory(prefix="qfuse-qcompare-") as tmp:
        work = Path(tmp)
        pre_process(float_path, work / "pre.onnx")
        pre = onnx.load(work / "pre.onnx")
        if next(o.version for o in pre.opset_import if o.domain in ("", "ai.onnx")) \
                < PER_CHANNEL_QDQ_OPSET:  # per-channel DequantizeLinear needs opset 13
            onnx.save(onnx.version_converter.convert_version(pre, PER_CHANNEL_QDQ_OPSET),
                      work / "pre.onnx")
        reader = type("Reader", (_Reader, CalibrationDataReader), {})(calib)
        ort_quantize(str(work / "pre.onnx"), str(work / "q.onnx"), reader,
                     quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=False,
                     activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                     calibrate_method=getattr(CalibrationMethod, method))
        return onnx.load(work / "q.onnx")


def _real_row(name: str, tool: str, model: onnx.ModelProto, fm: onnx.ModelProto,
              held_out: list[dict[str, np.ndarray]], task: str, seconds: float | None
              ) -> dict:
    from qfuse.compiler.quantize.evaluate import measure

    m = measure(model, fm, held_out, task)
    return {"model": name, "tool": tool, "kernels": m["kernels"],
            "vnni_kernels": m["vnni_kernels"], "unmatched": len(m["unmatched"]),
            "unmatched_ops": sorted({d["op"] for d in m["unmatched"]}),
            "min_cos": m["min_cos"], "mean_cos": m["mean_cos"], "agree": m["agree"],
            "seconds": seconds}


def main_real(args: argparse.Namespace) -> int:
    from qfuse.compiler.quantize.api import calibrate, run
    from qfuse.examples import realzoo

    names = args.models.split(",") if args.models else None
    tools = args.tools.split(",")
    rows = []
    print(f"{'model':<20} {'tool':<22} {'kernels':>7} {'no-split':>8} {'unmatched':>9} "
          f"{'min cos':>8} {'mean cos':>8} {'agree':>6} {'time s':>7}", flush=True)
    for entry in realzoo.models(names):
        fm = onnx.load(entry.float_path)
        evaluation = entry.evaluation
        if args.real_held_out:
            evaluation = [{entry.input_name: x[None]} for x in np.concatenate(
                entry.spec.make_inputs("eval", args.real_held_out))]
        stats, calib_s = None, 0.0
        jobs: list[tuple[str, object]] = []
        for t in tools:
            if t == "qfuse":
                jobs += [(f"qfuse {m}", m) for m in args.methods.split(",")]
                if args.bias_correction:
                    jobs += [(f"qfuse {m} bc", m) for m in args.methods.split(",")]
                if args.per_tensor_depthwise:
                    jobs += [(f"qfuse {m} dw/tensor", m) for m in args.methods.split(",")]
            elif t in ("MinMax", "Entropy"):
                jobs.append((f"quantize_static {t}", t))
            elif t == "nncf":
                jobs.append(("NNCF", t))
        for tool, how in jobs:
            start = time.perf_counter()
            try:
                if tool.startswith("qfuse"):
                    if stats is None:  # one calibration pass serves every method
                        stats = calibrate(fm, entry.calibration,
                                          correct_bias=args.bias_correction)
                        calib_s = time.perf_counter() - start
                    use = stats
                    if tool.endswith("dw/tensor"):  # the same pass, depthwise per tensor
                        use = dataclasses.replace(stats, channels={})
                    model = run(fm, entry.calibration, method=how, statistics=use,
                                correct_bias=tool.endswith(" bc")).model
                elif how == "nncf" or (how == "MinMax" and "qdq" in entry.quantized):
                    key = "nncf" if how == "nncf" else "qdq"
                    if key not in entry.quantized:
                        raise RuntimeError(entry.errors.get(key, "not built"))
                    model = onnx.load(entry.quantized[key])
                else:
                    model = quantize_static_real(entry.float_path, entry.calibration, how)
                seconds = time.perf_counter() - start
                if tool.startswith("qfuse") and seconds < calib_s:
                    seconds += calib_s  # the calibration pass the method's model needs
                row = _real_row(entry.name, tool, model, fm, evaluation, entry.task,
                                None if tool in ("NNCF",) or how == "MinMax" else seconds)
            except Exception as exc:  # noqa: BLE001 (a tool that fails is a result too)
                print(f"{entry.name:<20} {tool:<22} failed: {str(exc)[:200]}", flush=True)
                rows.append({"model": entry.name, "tool": tool, "error": str(exc)})
                continue
            rows.append(row)
            t = "-" if row["seconds"] is None else f"{row['seconds']:.1f}"
            print(f"{entry.name:<20} {tool:<22} {row['kernels']:>7} {row['vnni_kernels']:>8} "
                  f"{row['unmatched']:>9} {row['min_cos']:>8.5f} {row['mean_cos']:>8.5f} "
                  f"{row['agree']:>6.3f} {t:>7}  {' '.join(row['unmatched_ops'])}",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:

    from qfuse.compiler.quantize import quantize
    from qfuse.compiler.quantize.evaluate import measure
    from qfuse.examples import zoo

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--real", action="store_true", help="the real-model zoo (module docstring)")
    p.add_argument("--models", default=None)
    p.add_argument("--methods", default="minmax,percentile,l2,kl")
    p.add_argument("--tools", default="qfuse,MinMax,Entropy,nncf",
                   help="with --real: which of qfuse, MinMax, Entropy, nncf to run")
    p.add_argument("--real-held-out", type=int, default=0, metavar="N",
                   help="--real: N held-out inputs per model instead of the zoo's 8")
    p.add_argument("--bias-correction", action="store_true",
                   help="--real: also each qfuse method with bias correction")
    p.add_argument("--per-tensor-depthwise", action="store_true",
                   help="with --real: also qfuse with depthwise inputs per tensor")
    p.add_argument("--calib", type=int, default=8)
    p.add_argument("--held-out", type=int, default=16)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.real:
        return main_real(args)
    args.models = args.models or ",".join(zoo.SMALL_ARCHITECTURES)
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
