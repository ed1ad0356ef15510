"""`qfuse demo`: a small quantized model through the whole compiler.

Builds the ResNet-style example (float ONNX → onnxruntime quantize_static, QDQ), compiles it,
shows what fused (the first kernels of `qfuse inspect` and everything left unfused), checks the
fused output against the reference interpreter, and times fused against unfused.
"""

from __future__ import annotations

import time

import numpy as np

from qfuse.compiler.api import compile_model
from qfuse.compiler.cli_inspect import format_inspect
from qfuse.examples.zoo import model_path, sample_inputs


def _median_ms(run, feeds: dict[str, np.ndarray], iters: int) -> float:
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def main() -> int:
    path = model_path("resnet", quantized=True)
    print(f"model: ResNet-style example, quantized with onnxruntime quantize_static\n  {path}\n")
    start = time.perf_counter()
    fused = compile_model(path, threads=2)
    print(f"$ qfuse compile: {time.perf_counter() - start:.2f} s")
    info = fused.inspect()
    text = format_inspect(info).split("\n[")
    print("$ qfuse inspect (first kernels):\n[" + "\n[".join(text[2:5]).rstrip())
    print("   ...\n" + text[-1].split("\n\n", 1)[1])

    import onnx

    feeds = sample_inputs(onnx.load(path), 1, seed=1)[0]
    out = fused.run(feeds)
    ref = compile_model(path, mode="reference").run(feeds)
    name = fused.outputs[0]
    same = float(np.mean(out[name] == ref[name]))
    print(f"\nfused vs reference interpreter on '{name}': {same:.1%} identical, "
          f"max |diff| {np.abs(out[name] - ref[name]).max():.3g}")

    unfused = compile_model(path, mode="unfused", threads=2)
    for model in (fused, unfused):
        _median_ms(model.run, feeds, 20)  # warm-up
    t_fused, t_unfused = [], []
    for _ in range(5):  # interleaved rounds, so drift hits both alike
        t_fused.append(_median_ms(fused.run, feeds, 40))
        t_unfused.append(_median_ms(unfused.run, feeds, 40))
    f, u = float(np.median(t_fused)), float(np.median(t_unfused))
    print(f"timing (2 threads, batch 1, median of 5 rounds): fused {f:.3f} ms with "
          f"{len(info['kernels'])} kernels, unfused {u:.3f} ms with "
          f"{len(unfused.inspect()['kernels'])} kernels: unfused/fused = {u / f:.2f}x")
    return 0 if same >= 0.999 else 1
