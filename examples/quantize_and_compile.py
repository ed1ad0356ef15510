"""Build an example architecture as a float ONNX model, quantize it the way users do
(onnxruntime's quantize_static: QDQ, per-channel s8 weights, u8 activations, calibrated on
generated inputs), compile it with qfuse and print what fused.

    python -m qfuse.examples.quantize_and_compile resnet [--out DIR] [--json]

Architectures: resnet, mobilenetv2, inception, unet, vgg, shufflenet, transformer, resnet50.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from qfuse.compiler.api import compile_model
from qfuse.compiler.cli_inspect import format_inspect
from qfuse.examples.zoo import ARCHITECTURES, float_model, sample_inputs
from qfuse.examples.zoo.quantize import quantize
from qfuse.runtime.numerics import cosine


def build(name: str, out: Path) -> tuple[Path, Path]:
    """Write ``name``'s float and QDQ models into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    model = float_model(name)
    calib = sample_inputs(model, 4 if name == "resnet50" else 8, seed=0)
    qdq = quantize(model, calib)
    paths = out / f"{name}.onnx", out / f"{name}.qdq.onnx"
    onnx.save(model, paths[0])
    onnx.save(qdq, paths[1])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arch", choices=sorted(ARCHITECTURES))
    parser.add_argument("--out", type=Path, default=Path("out"))
    parser.add_argument("--json", action="store_true", help="print inspect as JSON")
    args = parser.parse_args(argv)
    float_path, qdq_path = build(args.arch, args.out)
    print(f"float model: {float_path}\nquantized (QDQ) model: {qdq_path}")
    start = time.perf_counter()
    model = compile_model(qdq_path)
    print(f"compiled in {time.perf_counter() - start:.2f} s\n")
    info = model.inspect()
    print(json.dumps(info, indent=1, default=str) if args.json else format_inspect(info))
    feeds = sample_inputs(onnx.load(float_path), 1, seed=1)[0]
    fused = model.run(feeds)
    reference = compile_model(qdq_path, mode="reference").run(feeds)
    for name in model.outputs:
        a, b = fused[name].ravel(), reference[name].ravel()
        print(f"\n{name}: fused vs reference interpreter cosine {cosine(a, b):.6f}, "
              f"max |diff| {np.abs(a - b).max():.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
