"""``qfuse quantize FP32.onnx OUT.onnx --calibration DATA [...]`` (compiler/cli.py delegates)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from qfuse.compiler.cli_output import STDOUT, emit
from qfuse.compiler.quantize.methods import METHODS

JSON_HELP = "print JSON instead of text; with a PATH, write the JSON there and print the text"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("quantize", help="calibrate a float model into an int8 QDQ / "
                                        "FakeQuantize model placed for the compiler")
    p.add_argument("model", type=Path, help="the float ONNX model")
    p.add_argument("output", type=Path, help="where to write the quantized model")
    p.add_argument("--calibration", required=True, type=Path,
                   help=".npz keyed by input name (batched on the first axis) or a folder "
                        "of .npz / .npy files")
    p.add_argument("--method", default="minmax", choices=METHODS,
                   help="activation range: minmax (default), percentile, l2 (DNNLOWP's L2 "
                        "error minimisation) or kl")
    p.add_argument("--percentile", type=float, default=99.99,
                   help="with --method percentile: percent of values kept (default 99.99)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--per-channel", dest="per_channel", action="store_true", default=True,
                       help="weights per output channel, inputs of depthwise convs "
                            "per channel (default)")
    group.add_argument("--per-tensor", dest="per_channel", action="store_false",
                       help="one scale per tensor everywhere")
    p.add_argument("--activations", default="u8", choices=["u8", "s8"],
                   help="activation type (default u8; weights are always s8)")
    p.add_argument("--symmetric", action="store_true",
                   help="symmetric activations (s8: zero point 0; u8: 128 around 0)")
    p.add_argument("--format", default="qdq", choices=["qdq", "fakequantize"],
                   help="QuantizeLinear/DequantizeLinear pairs (default) or OpenVINO "
                        "FakeQuantize")
    p.add_argument("--exclude", nargs="+", default=[], metavar="NODE",
                   help="node names to leave in float")
    p.add_argument("--bias-correction", action="store_true",
                   help="lower each layer's bias by the mean error its weights' quantization "
                        "adds, measured on the calibration data (off by default: README)")
    p.add_argument("--report", action="store_true",
                   help="per-layer SQNR against the float model on the calibration data, "
                        "worst first")
    p.add_argument("--json", nargs="?", const=STDOUT, default=None, metavar="PATH",
                   help=JSON_HELP + " (what was written, and the --report rows)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from qfuse.compiler.quantize.api import run
    from qfuse.compiler.quantize.report import format_report, sqnr_report

    result = run(args.model, args.calibration, args.output, method=args.method,
                 per_channel=args.per_channel, activations=args.activations,
                 symmetric=args.symmetric, format=args.format, exclude=args.exclude,
                 percentile=args.percentile / 100, progress=True,
                 correct_bias=args.bias_correction)
    nodes = result.model.graph.node
    quantizers = sum(n.op_type in ("QuantizeLinear", "FakeQuantize") for n in nodes)
    payload: dict[str, Any] = {"output": str(args.output), "format": args.format,
                               "method": args.method, "quantizers": quantizers,
                               "bias_correction": args.bias_correction}
    lines = [f"wrote {args.output}: {args.format}, {args.method}, {quantizers} quantizers"]
    if args.report:
        rows = sqnr_report(result.float_model, result.qdq, result.calibration, progress=True)
        lines.append(format_report(rows))
        payload["layers"] = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                              for k, v in r.items()} for r in rows]
    emit(args.json, payload, "\n".join(lines))
    return 0
