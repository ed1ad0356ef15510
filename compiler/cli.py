"""The ``qfuse`` command line (the only place that prints)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

EMULATED = ["tflite", "onnxruntime", "caffe2", "onednn", "tpu-mlir"]


def _cmd_run(args: argparse.Namespace) -> int:
    from qfuse.compiler.api import compile_model, random_inputs

    if args.emulate:
        from qfuse.compiler.cli_compare import emulated_model

        model = emulated_model(args.model, args.emulate)
    else:
        model = compile_model(args.model, mode=args.mode, threads=args.threads)
    if args.inputs:
        with np.load(args.inputs) as npz:
            feeds = {name: npz[name] for name in npz.files}
        missing = [n for n in model.inputs if n not in feeds]
        if missing:
            raise ValueError(f"{args.inputs} lacks model inputs {missing} (has {list(feeds)})")
    else:
        feeds = random_inputs(model, seed=0)
    outputs = model.run(feeds)
    if args.output:
        np.savez(args.output, **outputs)
        print(f"wrote {len(outputs)} output(s) to {args.output}")
    for name in model.outputs:
        value = outputs[name]
        flat = value.ravel()
        head = np.array2string(flat[:6], precision=5, separator=", ")
        print(f"{name}: {value.dtype}{list(value.shape)} {head}{' ...' if flat.size > 6 else ''}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from qfuse.compiler.cli_compare import main_compare

    return main_compare(args)


def _cmd_inspect(args: argparse.Namespace) -> int:
    if not args.error:
        from qfuse.compiler.cli_inspect import main_inspect

        return main_inspect(args)
    from qfuse.compiler.error_report import main_error

    return main_error(args)


def _cmd_compile(args: argparse.Namespace) -> int:
    from qfuse.compiler.cli_inspect import main_compile

    return main_compile(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from qfuse.compiler.bench import main_bench

    return main_bench(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from qfuse.examples.demo import main as demo

    return demo()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qfuse", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the passes do")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a model and print or save its outputs")
    p.add_argument("model", type=Path)
    p.add_argument("--inputs", type=Path, help=".npz keyed by input name (default: random)")
    p.add_argument("--output", type=Path, help="write outputs to this .npz")
    p.add_argument("--mode", default="fused", choices=["fused", "unfused", "fp32", "reference"])
    p.add_argument("--threads", type=int)
    p.add_argument("--emulate", choices=EMULATED,
                   help="run the imported graph in this framework's integer arithmetic "
                        "(instead of --mode)")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("compile", help="compile a model and print a summary")
    p.add_argument("model", type=Path)
    p.add_argument("--json", type=Path, help="write the plan (as `inspect --json`) here")
    p.add_argument("--mode", default="fused", choices=["fused", "unfused", "fp32"])
    p.add_argument("--threads", type=int)
    p.set_defaults(func=_cmd_compile)

    p = sub.add_parser("inspect", help="show every kernel and what fused")
    p.add_argument("model", type=Path)
    p.add_argument("--json", action="store_true")
    p.add_argument("--error", action="store_true",
                   help="per-layer quantization error against the float model (SQNR, LSB)")
    p.add_argument("--inputs", type=Path, help="with --error: .npz keyed by input name")
    p.add_argument("--mode", default="fused", choices=["fused", "unfused", "fp32"])
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("bench", help="benchmark against other engines")
    p.add_argument("model", type=Path)
    p.add_argument("--compare", default="unfused,fp32,onnxruntime,openvino",
                   help="engines besides qfuse fused (unfused, fp32, reference, onnxruntime, "
                        "openvino)")
    p.add_argument("--threads", type=int, help="threads for every engine (default: all CPUs)")
    p.add_argument("--iters", type=int, default=50, help="timed runs per engine")
    p.add_argument("--batch", type=int, help="leading input dimension (default: the model's)")
    p.add_argument("--json", type=Path, help="write every number to this file")
    p.add_argument("--plot", type=Path, help="PNG: fused vs unfused time per layer")
    p.add_argument("--profile", action="store_true",
                   help="per-kernel time, implementation, MACs and TOPS of the fused plan")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("compare", help="compare with another framework's integer arithmetic")
    p.add_argument("model", type=Path)
    p.add_argument("--emulate", required=True, choices=EMULATED)
    p.add_argument("--json", action="store_true")
    p.add_argument("--inputs", type=Path, help=".npz keyed by input name (default: random)")
    p.add_argument("--against", choices=["reference", "fused"],
                   help="baseline (default: fused when it exposes intermediates, else reference)")
    p.set_defaults(func=_cmd_compare)

    from qfuse.compiler.quantize.cli import add_parser as add_quantize_parser

    add_quantize_parser(sub)

    p = sub.add_parser("demo", help="a small end-to-end example")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from qfuse.compiler.errors import MalformedModelError, UnsupportedModelError

    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and cut: not an error of ours
        sys.stderr.close()
        return 0
    except (UnsupportedModelError, MalformedModelError, ValueError, FileNotFoundError,
            NotImplementedError) as exc:
        print(f"qfuse {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
