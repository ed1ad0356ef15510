"""A grouped convolution that oneDNN runs only on ref:any (ShuffleNet v1's 1x1 group
convolutions, 8 → 2 channels per group, on AVX2) runs as one dense convolution with
block-diagonal weights: a jit kernel, the same values as the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_builders import init, model, qdq_pair

from qfuse.compiler.api import compile_model, random_inputs

F = np.float32


def _grouped(cin: int, cout: int, group: int, kernel: int = 1):
    rng = np.random.default_rng(0)
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="gconv", group=group,
                              pads=[kernel // 2] * 4),
             *qdq_pair("c", "c", "y")]
    inits = [init("xs", np.array(0.02, F)), init("xz", np.array(128, np.uint8)),
             init("w", rng.integers(-127, 128, (cout, cin // group, kernel, kernel))
                  .astype(np.int8)),
             init("ws", rng.uniform(0.005, 0.01, cout).astype(F)),
             init("wz", np.zeros(cout, np.int8)),
             init("cs", np.array(0.05, F)), init("cz", np.array(120, np.uint8))]
    return model(nodes, {"x": ((1, cin, 9, 10), TensorProto.FLOAT)}, ["y"], inits, opset=13)


@pytest.mark.parametrize(("cin", "cout", "group"), [(32, 8, 4), (8, 32, 4), (24, 24, 3)])
def test_a_grouped_conv_oneDNN_runs_on_ref_is_dense_and_exact(cin: int, cout: int,
                                                               group: int) -> None:
    m = _grouped(cin, cout, group)
    compiled = compile_model(m)
    convs = [k for k in compiled.inspect()["kernels"] if k["node"] == "gconv"]
    assert convs and not [k for k in convs if k["impl"].startswith("ref")], convs
    feeds = random_inputs(compiled)
    want = compile_model(m, mode="reference").run(feeds)["y"]
    got = compiled.run(feeds)["y"]
    assert np.abs(got - want).max() <= 0.05 + 1e-6  # ≤ 1 step, as any fused conv
    unfused = compile_model(m, mode="unfused").run(feeds)["y"]
    assert np.abs(unfused - want).max() <= 0.05 + 1e-6


def test_the_dense_form_is_taken_only_where_the_grouped_one_is_slow() -> None:
    compiled = compile_model(_grouped(32, 64, 4, kernel=3))  # 8 → 16 per group: jit as is
    convs = [k for k in compiled.inspect()["kernels"] if k["node"] == "gconv"]
    assert convs and not [k for k in convs if "dense convolution" in k.get("note", "")]
