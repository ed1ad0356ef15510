"""The quantized zoo models compiled end to end: fused / unfused / fp32 vs their references
and vs ONNX Runtime.

Agreement is checked at two levels:

- per kernel (the lowering's own correctness): every node of the compiled graph, evaluated by
  the reference semantics (fused nodes: the chain item by item) on the inputs the plan itself
  computed, against the plan's output — integer tensors ≤ 1 LSB apart and, over the model's
  compute kernels, ≥ 99.9 % identical (standalone quantize reorders: ≥ 97 %, see below);
  float tensors within 1e-4 relative;
- without VNNI/AMX (tests/compiler/test_lower_no_vnni.py runs this module under
  ONEDNN_MAX_CPU_ISA=AVX2) the same checks hold: the lowering splits the int8 weights;
- end to end, against the reference interpreter on the *imported* graph: a 1-LSB difference
  on a rounding near-tie (oneDNN rounds x·f32(1/s) + zp, the FakeQuantize formula divides)
  propagates and grows through the following layers, so the outputs are held to a cosine
  ≥ 0.999 and a bounded number of output quantization steps (measured: ≤ 4, on unet), and
  the classifiers to the same top-1 as ONNX Runtime's default session (its unoptimized
  session, DQ → float op → Q, on a CPU where ORT's own int8 kernels saturate: tests/ort_int8.py).

Run with -s to print the kernel / reorder counts and agreement figures per model.
"""

from __future__ import annotations

import json
import re

import numpy as np
import onnxruntime as ort
import pytest

from qfuse.compiler.api import CompiledModel, compile_model
from qfuse.compiler.lower.no_vnni import (
    EXCESS,
    HIGH_HALF,
    LOW_HALF,
    PAIRED,
    SPLIT,
    impl_is_exact,
    isa_is_exact,
)
from qfuse.examples import zoo
from qfuse.ir import Op
from qfuse.passes import strip_quantization
from qfuse.passes.base import PassContext, run_pass
from qfuse.runtime.numerics import cosine
from qfuse.runtime.reference import evaluate
from tests.compiler.lower_helpers import Agreement, local_agreement, requires_exact_int8
from tests.ort_int8 import qdq_session

MODELS = zoo.SMALL_ARCHITECTURES
END_TO_END_LSB = 8
# Layout reorders between kernels in the fused plans (measured; a regression guard). vgg:
# Flatten of a channels-last tensor. (transformer: its K and V projections write s8 for the
# activation × activation matmuls, passes/signed_matmul_weights.py; unet's Resizes read their
# producers' layouts.) transformer: where its residual MatMuls run as 1x1 convolutions
# (passes/vector_matmul_as_conv.py, oneDNN's AVX2 GEMM), each sum post-op reads the MatMul's
# own input as its residual, so that u8 tensor is copied into the dst (2); as matmuls, a
# kernel dequantized it into a float32 operand instead (as many kernels).
MAX_REORDERS = {"resnet": 0, "mobilenetv2": 0, "inception": 0, "unet": 0, "vgg": 1,
                "shufflenet": 0, "transformer": 2}


def _output_step(model: CompiledModel, name: str) -> float:
    producer = model.graph.producer(name)
    if producer is not None and producer.op is Op.DEQUANTIZE_LINEAR:
        return float(np.asarray(model.graph.constant(producer.inputs[1])).ravel()[0])
    return 1.0


@pytest.fixture(scope="module", params=MODELS)
def case(request: pytest.FixtureRequest) -> dict:
    name = request.param
    model = zoo.quantized_model(name)
    feeds = zoo.sample_inputs(model, n=2, seed=11)
    return {
        "name": name,
        "model": model,
        "feeds": feeds,
        "reference": compile_model(model, mode="reference"),
        "ort": qdq_session(model),
        "compiled": {m: compile_model(model, mode=m) for m in ("fused", "unfused", "fp32")},
    }


@requires_exact_int8
@pytest.mark.parametrize("mode", ["fused", "unfused"])
def test_int8_modes_agree_per_kernel_and_end_to_end(case: dict, mode: str) -> None:
    compiled: CompiledModel = case["compiled"][mode]
    ref: CompiledModel = case["reference"]
    worst_out, same_out, cos = 0.0, [], 1.0
    local = Agreement()
    for feeds in case["feeds"]:
        local_agreement(compiled, feeds, local)
        got, expected = compiled.run(feeds), ref.run(feeds)
        for name in compiled.outputs:
            steps = np.abs(got[name].astype(np.float64) - expected[name]) / _output_step(
                ref, name)
            worst_out = max(worst_out, float(steps.max()))
            same_out.append(float(np.mean(steps < 1e-3)))
            cos = min(cos, cosine(got[name], expected[name]))
    info = compiled.inspect()
    print(f"\n{case['name']:12s} {mode:8s} kernels={len(info['kernels'])} "
          f"reorders={info['reorders']} io_reorders={info['io_reorders']} "
          f"numpy={info['numpy_kernels']} | per kernel: max {local.worst} LSB, "
          f"{100 * local.identical('compute'):.3f} % identical "
          f"(quantize reorders {100 * local.identical('quantize'):.2f} %) | outputs: max "
          f"{worst_out:.2f} steps, {100 * np.mean(same_out):.1f} % identical, cos {cos:.6f}")
    assert local.worst <= 1 and local.float_err <= 1e-4
    assert local.identical("compute") >= 0.999
    # A standalone quantize reads float values; after a linear Resize of dequantized data
    # many sit on exact rounding ties, which x·f32(1/s) + zp and the FakeQuantize formula
    # break apart (unet: 98.1 % identical). OpenVINO's own CPU FakeQuantize does the same.
    assert local.identical("quantize") >= 0.97
    assert worst_out <= END_TO_END_LSB and cos >= 0.999
    for kernel in info["kernels"]:
        # without VNNI oneDNN has only ref:any for a few shapes (shufflenet's grouped 1x1
        # convs, the transformer's matmuls with a sum): exact, not split; with VNNI none
        if kernel["primitive"] in ("convolution", "deconvolution", "matmul"):
            assert not kernel["impl"].startswith("ref") or not isa_is_exact(), kernel


@pytest.mark.parametrize("mode", ["fused", "unfused"])
def test_every_int8_kernel_is_exact_or_split(case: dict, mode: str) -> None:
    """Per primitive, from the implementation oneDNN picked (compiler/lower/no_vnni.py): an
    int8 conv / deconv / matmul runs on an exact implementation (VNNI, AMX, ref), or its
    record says how it stays exact — split weights (the halves, or pair-safe weights and their
    excess), or weights / depthwise
    products that cannot saturate — and names the inexact implementation that required it."""
    info = case["compiled"][mode].inspect()
    int8 = [k for k in info["kernels"] if k["primitive"] in ("convolution", "deconvolution",
                                                             "matmul")
            and k["src_dtype"] in ("u8", "s8")]
    assert int8
    for kernel in int8:
        how = kernel.get("exact_int8")
        if how is None:
            assert impl_is_exact(kernel["impl"]), kernel
            continue
        extra = how in (LOW_HALF, HIGH_HALF, EXCESS)
        assert extra or SPLIT in how or PAIRED in how or "no split needed" in how, how
        unsplit = re.search(r"unsplit primitive on (\S+)", how)
        if not extra and "ref:any accumulates" not in how:
            assert unsplit is not None and not impl_is_exact(unsplit.group(1)), how
    if isa_is_exact() and case["name"] in ("resnet", "mobilenetv2", "vgg"):
        assert not any(k.get("exact_int8") for k in int8)  # every kernel on VNNI / AMX


@requires_exact_int8
def test_fused_matches_onnxruntime(case: dict) -> None:
    compiled: CompiledModel = case["compiled"]["fused"]
    session: ort.InferenceSession = case["ort"]
    names = [o.name for o in session.get_outputs()]
    for feeds in case["feeds"]:
        got = compiled.run(feeds)
        theirs = dict(zip(names, session.run(None, feeds), strict=True))
        for name in compiled.outputs:
            assert cosine(got[name], theirs[name]) >= 0.999, name
            if got[name].ndim == 2:  # classifier logits
                np.testing.assert_array_equal(got[name].argmax(1), theirs[name].argmax(1))


def test_fp32_matches_the_stripped_float_graph(case: dict) -> None:
    stripped = case["reference"].graph.copy()
    run_pass("strip_quantization", strip_quantization.run, stripped, PassContext())
    compiled: CompiledModel = case["compiled"]["fp32"]
    for feeds in case["feeds"]:
        got, expected = compiled.run(feeds), evaluate(stripped, feeds)
        for name in compiled.outputs:
            scale = max(1.0, float(np.abs(expected[name]).max()))
            assert float(np.abs(got[name] - expected[name]).max()) <= 1e-4 * scale, name
    info = compiled.inspect()
    assert all(k["src_dtype"] in ("f32", None) for k in info["kernels"] if k["role"] == "op"
               and k["primitive"] in ("convolution", "matmul", "deconvolution"))


def test_fusion_shrinks_the_plan(case: dict) -> None:
    fused = case["compiled"]["fused"].inspect()
    unfused = case["compiled"]["unfused"].inspect()
    assert fused["reorders"] <= MAX_REORDERS[case["name"]]
    assert len(fused["kernels"]) < len(unfused["kernels"])
    # the excess kernels of pair-safe weights (":lo", no VNNI) aside: how many there are
    # follows the channel orders each graph allows (passes/pair_channels.py)
    assert sum(k["primitive"] == "convolution" and not k["name"].endswith(":lo")
               for k in fused["kernels"]) == sum(
        k["primitive"] == "convolution" and not k["name"].endswith(":lo")
        for k in unfused["kernels"])
    assert isinstance(fused["not_fused"], list)
    assert json.loads(json.dumps(fused))["kernels"]  # `qfuse inspect --json` material
    for kernel in fused["kernels"]:
        assert {"name", "primitive", "impl", "src_dtype", "dst_dtype", "post_ops",
                "optimizations", "absorbed"} <= set(kernel)
