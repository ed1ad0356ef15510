"""The ``qfuse`` command line (the only place that prints)."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from pathlib import Path

import numpy as np

import qfuse
from qfuse.compiler.bench_engines import ENGINES
from qfuse.compiler.cli_output import STDOUT
from qfuse.compiler.errors import InputError, QfuseError
from qfuse.compiler.files import load_npz, save_npz, writable
from qfuse.ir.mode import COMPILED_MODES, Mode

DESCRIPTION = "Compile quantized ONNX models into fused oneDNN int8 kernels, run, inspect and benchmark them."
EXIT_CODES = """exit codes:
  0  success
  1  a problem with the model, its inputs or the arguments (one line on stderr says which)
  2  the command line does not parse (usage)
  3  internal error: a bug in qfuse (-v prints the traceback; please report it)"""
MODEL_HELP = "the ONNX model file (QDQ, QOperator or FakeQuantize; a float model runs too)"
THREADS_HELP = "oneDNN threads (default: all CPUs)"
JSON_HELP = "print JSON instead of text; with a PATH, write the JSON there and print the text"

EMULATED = ["tflite", "onnxruntime", "caffe2", "onednn", "tpu-mlir"]


def _cmd_run(args: argparse.Namespace) -> int:
    from qfuse.compiler.api import compile_model, random_inputs

    if args.output:
        writable(args.output, "outputs")
    if args.emulate:
        from qfuse.compiler.cli_compare import emulated_model

        model = emulated_model(args.model, args.emulate)
    else:
        shapes = input_shapes(args)
        if args.inputs and shapes is None and Path(args.model).is_file():
            from qfuse.compiler.input_files import shapes_of

            shapes = shapes_of(Path(args.model), load_npz(args.inputs))
        model = compile_model(args.model, mode=args.mode, threads=args.threads,
                              input_shapes=shapes, exact_int8=exact_int8(args))
    if args.inputs:
        feeds = load_npz(args.inputs)
        missing = [n for n in model.inputs if n not in feeds]
        if missing:
            raise InputError(f"{args.inputs} lacks model inputs {missing} (has {list(feeds)})")
    else:
        feeds = random_inputs(model, seed=0)
    outputs = model.run(feeds)
    if args.output:
        save_npz(args.output, outputs)
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


def _cmd_check(args: argparse.Namespace) -> int:
    from qfuse.compiler.op_check import main_check

    return main_check(args)


def _cmd_inspect(args: argparse.Namespace) -> int:
    if not args.error and (args.float_model or args.inputs or args.int8_engine):
        raise InputError("--float, --int8-engine and --inputs go with --error")
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


INPUT_SHAPE_HELP = ("fix a graph input's shape, e.g. images=1x3x224x224 (repeatable; needed "
                    "when the model leaves dims symbolic)")


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """NAME=D0xD1x... → (NAME, (D0, D1, ...)); '' after '=' is a scalar."""
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
    except ValueError:
        shape = None
    if not sep or not name or shape is None or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME=D0xD1x... (e.g. "
                                         f"input=1x3x224x224)")
    return name, shape


def _shape_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-shape", dest="input_shape", action="append", type=_shape_arg,
                   metavar="NAME=D0xD1x...", help=INPUT_SHAPE_HELP)


def _int8_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inexact-int8", dest="inexact_int8", action="store_true",
                   help="on a CPU without VNNI/AMX, run oneDNN's int8 kernels as they are "
                        "(int16-saturating pair sums, as ONNX Runtime and OpenVINO do there): "
                        "faster, not exact; default: split weights so every sum is exact")


def exact_int8(args: argparse.Namespace) -> bool:
    """compile_model's ``exact_int8`` from the --inexact-int8 flag."""
    return not getattr(args, "inexact_int8", False)


def input_shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]] | None:
    """The --input-shape flags as compile_model's ``input_shapes`` (None when none given)."""
    given = getattr(args, "input_shape", None)
    return dict(given) if given else None


def _json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", nargs="?", const=STDOUT, default=None, metavar="PATH", help=JSON_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qfuse", description=DESCRIPTION, epilog=EXIT_CODES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"qfuse {qfuse.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log what the passes do; print the traceback of internal errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run a model and print or save its outputs")
    p.add_argument("model", type=Path, help=MODEL_HELP)
    p.add_argument("--inputs", type=Path, help=".npz keyed by input name (default: random)")
    p.add_argument("--output", type=Path, help="write outputs to this .npz")
    p.add_argument("--mode", default="fused", choices=list(Mode),
                   help="fused oneDNN kernels (default), one kernel per post-op, float, or the "
                        "numpy reference interpreter")
    p.add_argument("--threads", type=int, help=THREADS_HELP)
    p.add_argument("--emulate", choices=EMULATED,
                   help="run the imported graph in this framework's integer arithmetic "
                        "(instead of --mode)")
    _shape_flag(p)
    _int8_flag(p)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("compile", help="compile a model and print a summary")
    p.add_argument("model", type=Path, help=MODEL_HELP)
    _json_arg(p)
    p.add_argument("--mode", default="fused", choices=list(COMPILED_MODES),
                   help="what to compile (default: fused)")
    p.add_argument("--threads", type=int, help=THREADS_HELP)
    _shape_flag(p)
    _int8_flag(p)
    p.set_defaults(func=_cmd_compile)

    p = sub.add_parser("inspect", help="show every kernel and what fused")
    p.add_argument("model", type=Path, help=MODEL_HELP)
    _json_arg(p)
    p.add_argument("--error", action="store_true",
                   help="per-layer quantization error against the float model (SQNR, LSB)")
    p.add_argument("--float", type=Path, dest="float_model", metavar="FP32.onnx",
                   help="with --error: compare with this float model (run by onnxruntime, "
                        "tensors matched by name) instead of one rebuilt from the quantized "
                        "model")
    p.add_argument("--int8-engine", dest="int8_engine", choices=["reference", "onnxruntime"],
                   help="with --error: what runs the quantized model (default: the engine of "
                        "the float side: onnxruntime with --float (exact QDQ, optimizations "
                        "off), else qfuse's reference interpreter)")
    p.add_argument("--inputs", type=Path,
                   help="with --error: .npz keyed by input name, or .npy for a single-input "
                        "model (default: random N(0,1), seed 0)")
    p.add_argument("--mode", default="fused", choices=list(COMPILED_MODES),
                   help="which compiled form to describe (default: fused)")
    _shape_flag(p)
    _int8_flag(p)
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("bench", help="benchmark against other engines")
    p.add_argument("model", type=Path, help=MODEL_HELP)
    p.add_argument("--compare", default="unfused,fp32,onnxruntime,openvino", type=_engine_list,
                   metavar="ENGINE[,ENGINE...]",
                   help=f"engines besides qfuse fused, comma-separated, from: {', '.join(ENGINES)} "
                        "(default: unfused,fp32,onnxruntime,openvino)")
    p.add_argument("--threads", type=int, help="threads for every engine (default: all CPUs)")
    p.add_argument("--iters", type=int, default=50, help="timed runs per engine (default 50)")
    p.add_argument("--batch", type=int, help="leading input dimension (default: the model's)")
    p.add_argument("--inputs", type=Path,
                   help="run every engine on these inputs: .npz keyed by input name, or .npy "
                        "for a single-input model (default: random N(0,1), seed 0)")
    _json_arg(p)
    p.add_argument("--plot", type=Path, help="PNG: fused vs unfused time per layer")
    p.add_argument("--profile", action="store_true",
                   help="per-kernel time, implementation, MACs and TOPS of the fused plan")
    _shape_flag(p)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("compare", help="compare with another framework's integer arithmetic")
    p.add_argument("model", type=Path, help=MODEL_HELP)
    p.add_argument("--emulate", required=True, choices=EMULATED,
                   help="the framework whose integer arithmetic to emulate")
    _json_arg(p)
    p.add_argument("--inputs", type=Path, help=".npz keyed by input name (default: random)")
    p.add_argument("--against", choices=["reference", "fused"],
                   help="baseline (default: fused when it exposes intermediates, else reference)")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("check", help="op by op: every kernel fed exact QDQ's inputs, its "
                                     "integer output against exact QDQ's (max LSB per kernel)")
    p.add_argument("model", type=Path, help=MODEL_HELP)
    _json_arg(p)
    p.add_argument("--inputs", type=Path,
                   help=".npz keyed by input name, or .npy for a single-input model (default: "
                        "random N(0,1), seed 0)")
    p.add_argument("--engine", default="onnxruntime", choices=["onnxruntime", "interpreter"],
                   help="what computes the reference: onnxruntime with graph optimizations off "
                        "(default) or qfuse's reference interpreter")
    p.add_argument("--reference-model", dest="reference_model", type=Path, metavar="EXACT.onnx",
                   help="run this model as the reference instead of MODEL (a QOperator "
                        "model's exact QDQ form: onnxruntime's int8 kernels saturate without "
                        "VNNI)")
    p.add_argument("--mode", default="fused", choices=[Mode.FUSED, Mode.UNFUSED],
                   help="which compiled form to check (default: fused)")
    p.add_argument("--all", action="store_true", help="list identical tensors too")
    p.add_argument("--blame", action="store_true",
                   help="per differing tensor, the output cosine with only its difference "
                        "(the reference run from it on) and with only it fixed")
    p.add_argument("--blame-draws", dest="blame_draws", type=int, default=20, metavar="N",
                   help="with --blame: N random draws of as many one-step changes in the "
                        "most costly tensor (the model's own sensitivity; 0: none)")
    p.set_defaults(func=_cmd_check)

    from qfuse.compiler.quantize.cli import add_parser as add_quantize_parser

    add_quantize_parser(sub)

    p = sub.add_parser("demo", help="a small end-to-end example")
    p.set_defaults(func=_cmd_demo)
    return parser


def _engine_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown engine(s) {unknown}; choose from "
                                         f"{', '.join(ENGINES)}")
    return names


def one_line(exc: BaseException) -> str:
    """The message on one line (onnxruntime's and the checker's span several)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and cut: not an error of ours
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"qfuse {args.command}: interrupted", file=sys.stderr)
        return 130
    except (QfuseError, OSError) as exc:  # the model, the inputs, a path: the user's to fix
        print(f"qfuse {args.command}: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001  (anything else is a bug of ours)
        if args.verbose:
            traceback.print_exc()
        print(f"qfuse {args.command}: internal error: {type(exc).__name__}: {one_line(exc)}"
              + ("" if args.verbose else " (-v prints the traceback)"), file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
