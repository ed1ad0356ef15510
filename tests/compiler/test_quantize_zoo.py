"""`qfuse quantize` on the example zoo against ONNX Runtime's quantize_static (MinMax, as
examples/zoo/quantize.py calls it), with the same 8 calibration inputs (seed 0):

- the compiled model leaves no "no pass matched" node in the quantized region;
- it compiles to no more kernels than quantize_static's model, counted as a VNNI CPU runs them
  (compiler/quantize/evaluate.py: without the no-VNNI low halves, whose presence depends on
  the oneDNN implementation chosen, i.e. on the lowering, not the placement). Measured on AVX2 (raw
  / without halves, ours vs quantize_static): resnet 24/13 vs 25/14, mobilenetv2 31/19 vs
  32/20, inception 38/23 vs 39/24, unet 44 vs 48, shufflenet 40 vs 42, vgg 16 vs 17,
  transformer 29/21 vs 28/22;
- qfuse fused on 8 held-out inputs (seed 99) is at least as close to the float model
  (ONNX Runtime) as quantize_static's model: min cosine within 0.002.
"""

from __future__ import annotations

import onnx
import pytest

from qfuse.compiler.quantize import quantize
from qfuse.compiler.quantize.evaluate import measure
from qfuse.examples import zoo

COSINE_SLACK = 0.002
HELD_OUT = 8

# resnet (residual sums), mobilenetv2 (depthwise, Clip), unet (Concat groups, Resize,
# ConvTranspose), transformer (MatMul, LayerNorm, Softmax) always; the rest with QFUSE_SLOW=1
# (benchmarks/quantize_compare.py covers them all)
MODELS = [n if n in ("resnet", "mobilenetv2", "unet", "transformer")
          else pytest.param(n, marks=pytest.mark.slow) for n in zoo.SMALL_ARCHITECTURES]


@pytest.mark.parametrize("name", MODELS)
def test_quantized_zoo_model_fuses_and_matches_quantize_static(name: str) -> None:
    fm = zoo.float_model(name)
    calib = zoo.sample_inputs(fm, zoo.DEFAULT_CALIB_SAMPLES, seed=0)
    held_out = zoo.sample_inputs(fm, HELD_OUT, seed=99)
    ours = measure(quantize(fm, calib, method="minmax"), fm, held_out)
    theirs = measure(onnx.load(str(zoo.model_path(name, quantized=True))), fm, held_out)
    assert ours["unmatched"] == []
    assert ours["vnni_kernels"] <= theirs["vnni_kernels"], (ours, theirs)
    assert ours["min_cos"] >= theirs["min_cos"] - COSINE_SLACK, (ours, theirs)


def test_histogram_methods_on_vgg() -> None:
    fm = zoo.float_model("vgg")
    calib = zoo.sample_inputs(fm, zoo.DEFAULT_CALIB_SAMPLES, seed=0)
    held_out = zoo.sample_inputs(fm, HELD_OUT, seed=99)
    minmax = measure(quantize(fm, calib, method="minmax"), fm, held_out)
    for method in ("percentile", "l2", "kl"):
        ours = measure(quantize(fm, calib, method=method, bins=512), fm, held_out)
        assert ours["unmatched"] == [] and ours["kernels"] == minmax["kernels"], method
        assert ours["min_cos"] >= minmax["min_cos"] - COSINE_SLACK, (method, ours, minmax)
