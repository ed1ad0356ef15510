"""A residual copied for a sum post-op is summed in place when its other readers can run
first (compiler/lower/sum_in_place.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from qfuse.compiler.api import CompiledModel, compile_model, random_inputs
from qfuse.ir.postops import ComposerOptions
from tests.compiler.onnx_builders import init, model

OFF = ComposerOptions().without("sum_in_place")


def _qdq(name: str, value: str, scale: float) -> tuple[list[onnx.NodeProto], list]:
    inits = [init(f"{name}_s", np.float32(scale)), init(f"{name}_z", np.int8(0))]
    nodes = [helper.make_node("QuantizeLinear", [value, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                              [f"{name}_dq"])]
    return nodes, inits


def _c2f(reread: bool = False) -> onnx.ModelProto:
    """YOLOv8's C2f block in small, NNCF-style (s8, one scale for the split and the concat):
    an int8 conv's output split in halves of 24 channels; the second half b goes through a
    bottleneck (two 3x3 convs) whose output is added to b; a, b and the sum concatenated.
    ``reread``: b is also a graph output (it must keep its values)."""
    rng = np.random.default_rng(21)
    nodes, inits = _qdq("x", "x", 0.02)
    for name, (cin, cout, k) in {"w0": (8, 48, 1), "w1": (24, 24, 3), "w2": (24, 24, 3),
                                 "wy": (72, 8, 1)}.items():
        inits += [init(name, rng.integers(-60, 60, size=(cout, cin, k, k)).astype(np.int8)),
                  init(f"{name}_s", np.float32(0.004)), init(f"{name}_z", np.int8(0))]
        nodes.append(helper.make_node("DequantizeLinear", [name, f"{name}_s", f"{name}_z"],
                                      [f"{name}_dq"]))
    inits.append(init("split", np.array([24, 24], np.int64)))
    nodes.append(helper.make_node("Conv", ["x_dq", "w0_dq"], ["conv0"]))
    more, more_inits = _qdq("c0", "conv0", 0.05)
    nodes += more + [helper.make_node("Split", ["c0_dq", "split"], ["a", "b"], axis=1),
                     helper.make_node("Conv", ["b", "w1_dq"], ["conv1"], pads=[1, 1, 1, 1])]
    inits += more_inits
    more, more_inits = _qdq("c1", "conv1", 0.05)
    nodes += more + [helper.make_node("Conv", ["c1_dq", "w2_dq"], ["conv2"], pads=[1, 1, 1, 1])]
    inits += more_inits
    more, more_inits = _qdq("c2", "conv2", 0.05)
    nodes += more + [helper.make_node("Add", ["b", "c2_dq"], ["sum"])]
    inits += more_inits
    more, more_inits = _qdq("s", "sum", 0.05)
    nodes += more + [helper.make_node("Concat", ["a", "b", "s_dq"], ["cat"], axis=1),
                     helper.make_node("Conv", ["cat", "wy_dq"], ["y"])]
    inits += more_inits
    outputs = ["y", "b"] if reread else ["y"]
    return model(nodes, {"x": ([1, 8, 48, 40], TensorProto.FLOAT)}, outputs, inits)


def _copies(m: CompiledModel) -> list[str]:
    return [k.name for k in m.plan.kernels if "for its sum post-op" in k.info.note]


def test_residual_of_c2f_is_summed_in_place() -> None:
    """The bottleneck's second conv sums into b's own buffer: the concat's copy of b runs
    before it instead of after, and the copy of b into the conv's dst goes. Bit-identical
    with the plan that copies, also every value both materialize. (merge_split_concat, off
    here, makes the concat read both halves from the Split's source, so b is no longer read
    after the sum and neither plan copies it.)"""
    unmerged = ComposerOptions().without("merge_split_concat")
    on = compile_model(_c2f(), composer=unmerged)
    off = compile_model(_c2f(), composer=unmerged.without("sum_in_place"))
    assert len(_copies(off)) == 1 and not _copies(on)
    assert len(on.plan.kernels) == len(off.plan.kernels) - 1
    assert on.plan.notes["in_place_sums"] == off.plan.notes["in_place_sums"] + 1
    names = [k.name for k in on.plan.kernels]
    [summer] = [k for k in on.plan.kernels if "sums in place" in k.info.note]
    copies_of_b = [i for i, k in enumerate(on.plan.kernels)
                   if k.info.op == "Concat" and any("b" in r for r in k.reads)]
    assert copies_of_b and max(copies_of_b) < names.index(summer.name)
    for seed in range(3):
        feeds = random_inputs(on, seed=seed)
        feeds["x"] *= 40
        got, want = on.run(feeds), off.run(feeds)
        assert all(np.array_equal(got[k], want[k]) for k in want)
        everything, reference = on.run_all(feeds), off.run_all(feeds)
        shared = everything.keys() & reference.keys()
        assert len(shared) >= 6
        assert all(np.array_equal(everything[k], reference[k]) for k in shared)


def test_residual_read_after_the_sum_keeps_its_copy() -> None:
    """b is a graph output as well: its buffer must keep b, so the copy stays."""
    on = compile_model(_c2f(reread=True))
    assert len(_copies(on)) == 1
    assert not any("sums in place" in k.info.note for k in on.plan.kernels)
