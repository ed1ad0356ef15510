"""widen_gate (passes/widen_gate.py): a squeeze-excitation gate's convolution writes the gate
repeated k times, and its multiply reads that in rows of k·C with no repeat kernel between.
Exact: bit-identical to the plan without it (composer option ``widen_gate``), every value."""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import TensorProto, helper

import qfuse
from qfuse.compiler.api import random_inputs
from qfuse.ir.postops import ComposerOptions
from qfuse.ir.rows import GATE_ROW, repeats
from tests.compiler.test_memory_order import squeeze_excitation

OFF = ComposerOptions().without("widen_gate")


def _gate_convs(compiled: qfuse.CompiledModel, channels: int) -> list[str]:
    """The dst layouts of the convolutions writing a [1, channels·k, 1, 1] gate, k > 1."""
    found = []
    for kernel in compiled.inspect()["kernels"]:
        layout = kernel["dst_layouts"][0]
        dims = re.search(r"\(1, (\d+), 1, 1\)", layout)
        if kernel["op"] == "Conv" and dims and int(dims.group(1)) > channels \
                and int(dims.group(1)) % channels == 0:
            found.append(layout)
    return found


def _gate_multiply(compiled: qfuse.CompiledModel) -> dict:
    [mul] = [k for k in compiled.inspect()["kernels"] if k["op"] == "Mul"]
    return mul


def test_the_gate_is_written_repeated_and_read_in_long_rows() -> None:
    """[1, 24, 12, 12]: 144 rows of 24, too few for a repeat kernel (ir.rows), so without
    the pass the multiply walks rows of 24; with it the gate's Conv writes 24·k values and
    the multiply reads rows of 24·k, no kernel more."""
    model = squeeze_excitation(24, 12)
    on, off = qfuse.compile_model(model), qfuse.compile_model(model, composer=OFF)
    k = repeats(12 * 12, 24, GATE_ROW)
    assert k == 24
    assert _gate_convs(on, 24) == [f"f32 (1, {24 * k}, 1, 1) strides=({24 * k}, 1, {24 * k}, "
                                   f"{24 * k})"] and _gate_convs(off, 24) == []
    assert "tiled_rows" in _gate_multiply(on)["optimizations"]
    assert "tiled_rows" not in _gate_multiply(off)["optimizations"]
    assert f"(6, {24 * k}) strides" in _gate_multiply(on)["src_layouts"][0]
    assert len(on.plan.kernels) == len(off.plan.kernels)
    assert not [k for k in on.inspect()["kernels"] if ":tile:" in k["name"]]
    # the gate's Slice is a view of the Conv's output: no kernel, not reported as unfused
    assert [n["node"] for n in on.inspect()["not_fused"]] == [
        n["node"] for n in off.inspect()["not_fused"]]
    for seed in range(3):
        feeds = random_inputs(on, seed=seed)
        assert np.array_equal(on.run(feeds)["y"], off.run(feeds)["y"])
        every_on, every_off = on.run_all(feeds), off.run_all(feeds)
        shared = every_on.keys() & every_off.keys()
        assert "gd" in shared and len(shared) == len(every_off)
        assert all(np.array_equal(every_on[v], every_off[v]) for v in shared)
    unfused = qfuse.compile_model(model, mode="unfused")
    feeds = random_inputs(on, seed=5)
    assert np.array_equal(on.run(feeds)["y"], unfused.run(feeds)["y"])


def _plan_gates(model: onnx.ModelProto, channels: int = 24) -> list[str]:
    return _gate_convs(qfuse.compile_model(model), channels)


def test_not_applied() -> None:
    assert _plan_gates(squeeze_excitation(24, 12))  # the case above applies
    # a 1x1 image: rows of C are all there is (no k)
    assert _plan_gates(squeeze_excitation(24, 1)) == []
    # the gate is a graph output: its producer keeps writing it alone
    model = squeeze_excitation(24, 12)
    model.graph.output.append(helper.make_tensor_value_info("gd", TensorProto.FLOAT,
                                                            [1, 24, 1, 1]))
    assert _plan_gates(model) == []
    # a chain large enough for a repeat kernel (2304 rows): the lowering makes one
    assert _plan_gates(squeeze_excitation(24, 48)) == []
    # more channels than GATE_SHORT (rows of 160 gain about what a wider Conv costs), though
    # a k exists: 64 rows of 160, repeated 4 times
    assert repeats(8 * 8, 160, GATE_ROW) == 4
    assert _plan_gates(squeeze_excitation(160, 8), 160) == []
