"""Bad input campaign: malformed models and command-line misuse, each run through ``qfuse``.

Every case runs one command line in a worker process (bad_input_worker.py) with a timeout and
expects one of the documented outcomes (README "Bad input", docs/design.md):

- ``error``: exit code 1 and exactly one line on stderr, ``qfuse CMD: SomeError: ...``, that
  names what is wrong (``match``, a regular expression) — no traceback, no "internal error";
- ``usage``: exit code 2 (argparse's usage message);
- ``ok``: exit code 0, a documented accepted behaviour.

Never a hang (the worker is killed after TIMEOUT seconds) and never a crash (the worker
dying). The worker limits its address space, so a case that still allocated an absurd size
fails there with MemoryError instead of taking the machine's memory.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.compiler import bad_input_models as bm
from tests.compiler.bad_input_models import base, f32, init, node, set_attr, single

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0  # seconds per case; a healthy case takes well under one
BIG = 10**9


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[Path], list[str]]  # writes files under the folder, returns qfuse's argv
    expect: str  # "error", "usage" or "ok"
    match: str = ""  # regular expression the error line must contain (case-insensitive)


CASES: list[Case] = []


def case(id: str, expect: str, match: str = "") -> Callable[[Callable[[Path], list[str]]],
                                                           Callable[[Path], list[str]]]:
    def register(make: Callable[[Path], list[str]]) -> Callable[[Path], list[str]]:
        CASES.append(Case(id, make, expect, match))
        return make
    return register


def model_case(id: str, build: Callable[[], onnx.ModelProto], match: str,
               command: str = "run", expect: str = "error") -> None:
    """A model from ``build``, saved unchecked, given to ``qfuse COMMAND`` (default: run,
    which compiles the fused plan and runs it once on random inputs)."""
    def make(tmp: Path) -> list[str]:
        return [command, save(tmp, build())]
    CASES.append(Case(id, make, expect, match))


def save(tmp: Path, m: onnx.ModelProto, name: str = "model.onnx") -> str:
    path = tmp / name
    path.write_bytes(m.SerializeToString())
    return str(path)


def npz(tmp: Path, name: str = "in.npz", **arrays: np.ndarray) -> str:
    path = tmp / name
    np.savez(path, **arrays)
    return str(path)


def good_x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)


# ---------------------------------------------------------------------------- the model file
def _bytes_case(id: str, data: bytes, match: str, name: str = "model.onnx") -> None:
    def make(tmp: Path) -> list[str]:
        (tmp / name).write_bytes(data)
        return ["compile", str(tmp / name)]
    CASES.append(Case(id, make, "error", match))


VALID = base().SerializeToString()
_bytes_case("file_empty", b"", r"empty|no graph|not an ONNX model")
_bytes_case("file_truncated_half", VALID[: len(VALID) // 2], r"not an ONNX model")
_bytes_case("file_truncated_one_byte", VALID[:1], r"not an ONNX model")
_bytes_case("file_truncated_minus_one", VALID[:-1], r"not an ONNX model|rejects")
_bytes_case("file_random_bytes", bytes(np.random.default_rng(1).integers(0, 256, 4096,
                                                                         dtype=np.uint8)),
            r"not an ONNX model")
_bytes_case("file_text", b"hello, I am not a model\n", r"not an ONNX model")
_bytes_case("file_zeros", bytes(1000), r"not an ONNX model")
_bytes_case("file_graph_proto_not_model", base().graph.SerializeToString(),
            r"not an ONNX model|no opset|no graph|rejects")
_bytes_case("file_empty_model_proto", onnx.ModelProto().SerializeToString(),
            r"empty|no graph|not an ONNX model|no opset")
_bytes_case("file_npz_as_model", b"PK\x03\x04" + bytes(200), r"not an ONNX model")
_bytes_case("file_doubled", VALID + VALID, r"not an ONNX model|rejects|duplicate|more than")
# onnx.load reads the format the suffix names: JSON and the two text formats have their own
# parse errors
_bytes_case("file_json_not_a_model", b'{"a": 1}', r"not an ONNX model", "model.json")
_bytes_case("file_textproto_not_a_model", b"garbage", r"not an ONNX model", "model.textproto")
_bytes_case("file_onnxtxt_not_a_model", b"garbage\n", r"not an ONNX model", "model.onnxtxt")


@case("model_missing", "error", r"No such file|not found|does not exist")
def _(tmp: Path) -> list[str]:
    return ["compile", str(tmp / "nope.onnx")]


@case("model_is_a_directory", "error", r"director")
def _(tmp: Path) -> list[str]:
    (tmp / "dir.onnx").mkdir()
    return ["compile", str(tmp / "dir.onnx")]


@case("model_is_a_fifo", "error", r"not a regular file")
def _(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "fifo.onnx")
    return ["compile", str(tmp / "fifo.onnx")]


@case("model_is_dev_zero", "error", r"not a regular file")
def _(tmp: Path) -> list[str]:
    return ["compile", "/dev/zero"]


@case("model_path_too_long", "error", r"too long|No such file")
def _(tmp: Path) -> list[str]:
    return ["compile", str(tmp / ("a" * 5000))]


@case("model_run_directory", "error", r"director")
def _(tmp: Path) -> list[str]:
    return ["run", str(tmp)]


@case("model_inspect_directory", "error", r"director")
def _(tmp: Path) -> list[str]:
    return ["inspect", str(tmp)]


@case("model_bench_directory", "error", r"director")
def _(tmp: Path) -> list[str]:
    return ["bench", str(tmp), "--compare", "unfused", "--iters", "1"]


@case("model_compare_directory", "error", r"director")
def _(tmp: Path) -> list[str]:
    return ["compare", str(tmp), "--emulate", "onnxruntime"]


# ---------------------------------------------------------------------------- graph structure
def _no_outputs() -> onnx.ModelProto:
    m = base()
    del m.graph.output[:]
    return m


def _no_nodes_no_outputs() -> onnx.ModelProto:
    m = _no_outputs()
    del m.graph.node[:]
    return m


def _cycle() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second"),
             helper.make_node("Relu", ["a"], ["y"], name="out")]
    return bm.graph_model(nodes, [helper.make_tensor_value_info("x", 1, [1, 4])],
                          [helper.make_tensor_value_info("y", 1, [1, 4])], [])


def _self_loop() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "a"], ["a"], name="loop"),
             helper.make_node("Relu", ["a"], ["y"], name="out")]
    return bm.graph_model(nodes, [helper.make_tensor_value_info("x", 1, [1, 4])],
                          [helper.make_tensor_value_info("y", 1, [1, 4])], [])


def _dangling() -> onnx.ModelProto:
    m = base()
    node(m, "conv").input[1] = "nowhere"
    return m


def _duplicate_producer() -> onnx.ModelProto:
    m = base()
    m.graph.node.append(helper.make_node("Relu", ["x"], ["c"], name="second_c"))
    return m


def _duplicate_graph_input() -> onnx.ModelProto:
    m = base()
    m.graph.input.append(m.graph.input[0])
    return m


def _duplicate_initializer() -> onnx.ModelProto:
    m = base()
    m.graph.initializer.append(init("x_s", 0.5, np.float32))
    return m


def _output_not_produced() -> onnx.ModelProto:
    m = base()
    m.graph.output.append(helper.make_tensor_value_info("ghost", 1, [1]))
    return m


def _input_also_produced() -> onnx.ModelProto:
    m = base()
    node(m, "relu").output[0] = "x"
    m.graph.output[0].name = "x"
    return m


def _empty_op_type() -> onnx.ModelProto:
    m = base()
    node(m, "relu").op_type = ""
    return m


def _node_without_outputs() -> onnx.ModelProto:
    m = base()
    m.graph.node.append(helper.make_node("Relu", ["y"], [], name="void"))
    return m


def _empty_output_name() -> onnx.ModelProto:
    m = base()
    m.graph.output[0].name = ""
    return m


def _required_input_empty() -> onnx.ModelProto:
    m = base()
    node(m, "conv").input[1] = ""
    return m


def _unknown_op() -> onnx.ModelProto:
    m = base()
    node(m, "relu").op_type = "FrobnicateTensor"
    return m


def _unknown_domain() -> onnx.ModelProto:
    m = base()
    node(m, "relu").domain = "com.example.nowhere"
    return m


def _opset(version: int) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        m = base()
        m.opset_import[0].version = version
        return m
    return build


def _no_opset() -> onnx.ModelProto:
    m = base()
    del m.opset_import[:]
    return m


def _ir_version(version: int) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        m = base()
        m.ir_version = version
        return m
    return build


def _too_many_inputs() -> onnx.ModelProto:
    m = base()
    node(m, "relu").input.extend(["x", "x"])
    return m


def _too_many_outputs() -> onnx.ModelProto:
    m = base()
    node(m, "relu").output.extend(["y2", "y3"])
    return m


model_case("graph_no_outputs", _no_outputs, r"no outputs")
model_case("graph_no_nodes_no_outputs", _no_nodes_no_outputs, r"no outputs")
model_case("graph_cycle", _cycle, r"cycle|topolog|not produced|produced by no|before")
model_case("graph_self_loop", _self_loop, r"cycle|topolog|own output|produced|before")
model_case("graph_dangling_input", _dangling, r"nowhere")
model_case("graph_duplicate_producer", _duplicate_producer, r"'c'|duplicate|more than once")
model_case("graph_duplicate_input", _duplicate_graph_input, r"'x'|duplicate")
model_case("graph_duplicate_initializer", _duplicate_initializer, r"x_s|duplicate")
model_case("graph_output_not_produced", _output_not_produced, r"ghost")
model_case("graph_input_also_produced", _input_also_produced, r"'x'|duplicate|more than once")
model_case("graph_empty_op_type", _empty_op_type, r"relu|op_type|op type")
model_case("graph_node_without_outputs", _node_without_outputs, r"void|output")
model_case("graph_empty_output_name", _empty_output_name, r"output|name")
model_case("graph_required_input_empty", _required_input_empty, r"conv")
model_case("graph_unknown_op", _unknown_op, r"Frobnicate")
model_case("graph_unknown_domain", _unknown_domain, r"com\.example\.nowhere")
model_case("graph_too_many_inputs", _too_many_inputs, r"relu")
model_case("graph_too_many_outputs", _too_many_outputs, r"relu")
model_case("opset_zero", _opset(0), r"opset")
model_case("opset_absurd", _opset(10**6), r"opset")
model_case("opset_negative", _opset(-3), r"opset")
model_case("opset_none", _no_opset, r"opset")
model_case("ir_version_absurd", _ir_version(10**6), r"ir_version|IR version|rejects")
model_case("ir_version_zero", _ir_version(0), r"ir_version|IR version|rejects")


# ---------------------------------------------------------------------------- graph inputs
def _input_type(elem_type: int) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        m = base()
        m.graph.input[0].type.tensor_type.elem_type = elem_type
        return m
    return build


def _input_not_tensor() -> onnx.ModelProto:
    m = base()
    m.graph.input[0].CopyFrom(helper.make_tensor_sequence_value_info("x", 1, [1, 3, 8, 8]))
    return m


def _input_no_shape() -> onnx.ModelProto:
    m = base()
    m.graph.input[0].type.tensor_type.ClearField("shape")
    return m


def _input_dims(*dims: int | str) -> Callable[[], onnx.ModelProto]:
    return lambda: base(dims)


model_case("input_type_string", _input_type(TensorProto.STRING), r"'x'.*STRING|STRING")
model_case("input_type_undefined", _input_type(0), r"'x'|UNDEFINED|elem")
model_case("input_type_bogus", _input_type(99), r"'x'|99|type")
model_case("input_type_int8_into_quantize", _input_type(TensorProto.INT8), "", expect="ok")
model_case("input_not_a_tensor", _input_not_tensor, r"'x'")
model_case("input_no_shape", _input_no_shape, r"'x'.*rank|shape")
model_case("input_symbolic_channel", _input_dims(1, "C", 8, 8), r"'x'.*symbolic")
model_case("input_negative_dim", _input_dims(1, 3, -5, 8), r"'x'|-5")
model_case("input_wrong_channels", _input_dims(1, 5, 8, 8), r"conv|channel")
model_case("input_rank_2", _input_dims(1, 3), r"conv|rank|spatial")
model_case("input_rank_64", _input_dims(*([1] * 62), 8, 8), r"conv|rank|spatial|supported")
model_case("input_1e9_channels", _input_dims(1, BIG, 8, 8), r"'x'.*limit|limit")
model_case("input_1e5x1e5", _input_dims(1, 3, 10**5, 10**5), r"'x'.*limit|limit")
model_case("input_dim_2e62", _input_dims(1, 3, 2**62, 8), r"'x'.*limit|limit")
model_case("input_product_overflows_int64", _input_dims(2**40, 3, 2**40, 8),
           r"'x'.*limit|limit")
model_case("input_zero_dim", _input_dims(1, 3, 0, 8), r"'x'|conv|empty|zero|0")


# ---------------------------------------------------------------------------- quantization
def _with_init(tensor: onnx.TensorProto) -> Callable[[], onnx.ModelProto]:
    return lambda: bm.replace_init(base(), tensor)


for _id, _value in [("zero", 0.0), ("negative", -0.05), ("nan", np.nan),
                    ("minus_inf", -np.inf), ("minus_zero", -0.0)]:
    model_case(f"scale_{_id}", _with_init(init("x_s", _value, np.float32)), r"'q'.*scale")

# Valid ONNX that qfuse's int8 kernels cannot compute exactly: runs in float32 or as
# onnxruntime islands (docs/design.md "Bad input"; test_extreme_scales_run_in_float_and_match
# checks values).
# +inf: quantize_static writes it for a tensor holding -inf (a causal attention mask)
for _id, _value in [("3e38", 3e38), ("denormal", 1e-45), ("1e31", 1e31), ("inf", np.inf)]:
    model_case(f"scale_{_id}_runs", _with_init(init("x_s", _value, np.float32)), "",
               expect="ok")
model_case("scale_1e-30_accepted", _with_init(init("x_s", 1e-30, np.float32)), "", expect="ok")


def _int32_bias(scale: float) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        m = base()
        m.graph.initializer.extend([init("b", [5, -3, 0, 7], np.int32),
                                    init("b_s", [scale] * 4, np.float32)])
        m.graph.node.insert(3, helper.make_node("DequantizeLinear", ["b", "b_s"], ["bd"],
                                                name="bdq", axis=0))
        node(m, "conv").input.append("bd")
        return m
    return build


# quantize_static's int32 bias has scale s_x * s_w: subnormal ones occur in real models
model_case("bias_int32_subnormal_scale_ok", _int32_bias(1.59e-39), "", expect="ok")
model_case("bias_int32_scale_zero", _int32_bias(0.0), r"'bdq'.*scale")
model_case("scale_float64", _with_init(init("x_s", 0.05, np.float64)), r"scale|type")
model_case("scale_int", _with_init(init("x_s", 1, np.int32)), r"scale|type")
model_case("scale_2d", _with_init(init("x_s", [[0.05]], np.float32)), r"scale")
model_case("scale_empty", _with_init(init("x_s", np.zeros(0), np.float32)), r"scale")
model_case("weight_scale_nan_channel",
           _with_init(init("w_s", [0.01, np.nan, 0.01, 0.01], np.float32)), r"'wdq'.*scale")
model_case("weight_scale_zero_channel",
           _with_init(init("w_s", [0.01, 0.0, 0.01, 0.01], np.float32)), r"'wdq'.*scale")
model_case("weight_scale_3e38_island",
           _with_init(init("w_s", [3e38, 0.01, 0.01, 0.01], np.float32)), "", expect="ok")
model_case("weight_scale_count_mismatch", _with_init(init("w_s", [0.01] * 3, np.float32)),
           r"'wdq'|scale")
model_case("zp_u8_300_as_int32_data",
           _with_init(bm.raw_int32_data("x_z", TensorProto.UINT8, [300])), r"x_z|300")
model_case("zp_u8_minus_1_as_int32_data",
           _with_init(bm.raw_int32_data("x_z", TensorProto.UINT8, [-1])), r"x_z|-1")
model_case("zp_s8_200_weight",
           _with_init(bm.raw_int32_data("w_z", TensorProto.INT8, [0, 200, 0, 0], [4])),
           r"w_z|200")
model_case("zp_s8_minus_129_weight",
           _with_init(bm.raw_int32_data("w_z", TensorProto.INT8, [0, -129, 0, 0], [4])),
           r"w_z|-129")
model_case("weight_s8_holding_300",
           _with_init(bm.raw_int32_data("w", TensorProto.INT8, [300] * 108, [4, 3, 3, 3])),
           r"'w'|300")
model_case("zp_int32_dtype", _with_init(init("x_z", 128, np.int32)), r"'q'.*zero point|zero")
model_case("zp_float_dtype", _with_init(init("x_z", 128, np.float32)), r"zero point|type")
model_case("zp_int16_dtype", _with_init(init("x_z", 128, np.int16)), r"zero point|INT16|type")
model_case("zp_shape_mismatch", _with_init(init("x_z", [128, 128], np.uint8)),
           r"zero point|shape")
model_case("zp_weight_nonzero_s8_symmetric_ok",
           _with_init(init("w_z", [0, 3, 0, 0], np.int8)), r"", expect="ok")
model_case("weight_axis_out_of_range",
           lambda: set_attr(base(), "wdq", axis=7), r"'wdq'.*axis")


def _scale_is_graph_input() -> onnx.ModelProto:
    m = base()
    m.graph.initializer.remove(next(t for t in m.graph.initializer if t.name == "x_s"))
    m.graph.input.append(helper.make_tensor_value_info("x_s", 1, []))
    return m


def _zp_is_graph_input() -> onnx.ModelProto:
    m = base()
    m.graph.initializer.remove(next(t for t in m.graph.initializer if t.name == "x_z"))
    m.graph.input.append(helper.make_tensor_value_info("x_z", TensorProto.UINT8, []))
    return m


model_case("scale_not_constant", _scale_is_graph_input, "", expect="ok")
model_case("zp_not_constant", _zp_is_graph_input, "", expect="ok")
model_case("quantize_output_dtype_int4",
           lambda: set_attr(base(), "q", output_dtype=TensorProto.INT4), r"'q'|INT4|type")


# ---------------------------------------------------------------------------- initializer data
def _raw_too_short() -> onnx.ModelProto:
    t = init("w", np.zeros((4, 3, 3, 3)), np.int8)
    t.raw_data = t.raw_data[:10]
    return bm.replace_init(base(), t)


def _float_data_too_long() -> onnx.ModelProto:
    t = helper.make_tensor("x_s", TensorProto.FLOAT, [], [0.05])
    t.float_data.extend([1.0, 2.0])
    return bm.replace_init(base(), t)


def _negative_dims() -> onnx.ModelProto:
    t = onnx.TensorProto(name="w_s", data_type=TensorProto.FLOAT, dims=[-4])
    t.float_data.extend([0.01] * 4)
    return bm.replace_init(base(), t)


def _declared_huge(dims: list[int], data_type: int = TensorProto.INT8,
                   name: str = "w") -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        t = onnx.TensorProto(name=name, data_type=data_type, dims=dims)
        t.raw_data = bytes(108)
        return bm.replace_init(base(), t)
    return build


def _undefined_type() -> onnx.ModelProto:
    t = onnx.TensorProto(name="x_s", data_type=0)
    t.raw_data = np.float32(0.05).tobytes()
    return bm.replace_init(base(), t)


def _bogus_type() -> onnx.ModelProto:
    t = onnx.TensorProto(name="x_s", data_type=77)
    t.raw_data = np.float32(0.05).tobytes()
    return bm.replace_init(base(), t)


def _string_weight() -> onnx.ModelProto:
    t = onnx.TensorProto(name="w", data_type=TensorProto.STRING, dims=[1])
    t.string_data.append(b"weights")
    return bm.replace_init(base(), t)


def _raw_and_typed() -> onnx.ModelProto:
    t = init("x_s", 0.05, np.float32)
    t.float_data.append(0.5)
    return bm.replace_init(base(), t)


def _sparse(dims: list[int], values: list[float], indices: list[int] | np.ndarray,
            ) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        nodes = [helper.make_node("Add", ["x", "sp"], ["y"], name="add")]
        m = bm.graph_model(nodes, [helper.make_tensor_value_info("x", 1, [1, 4])],
                           [helper.make_tensor_value_info("y", 1, None)], [])
        sparse = helper.make_sparse_tensor(
            numpy_helper.from_array(np.asarray(values, np.float32), "sp"),
            numpy_helper.from_array(np.asarray(indices, np.int64), "sp_idx"), dims)
        m.graph.sparse_initializer.append(sparse)
        return m
    return build


model_case("init_raw_too_short", _raw_too_short, r"\bw\b")
model_case("init_float_data_too_long", _float_data_too_long, r"x_s")
model_case("init_negative_dims", _negative_dims, r"w_s")
model_case("init_declared_1e9_channels", _declared_huge([BIG, 3, 3, 3]), r"\bw\b")
model_case("init_declared_1e5x1e5", _declared_huge([10**5, 10**5]), r"\bw\b")
model_case("init_declared_product_overflow", _declared_huge([2**40, 2**40]), r"\bw\b")
model_case("init_declared_huge_float", _declared_huge([BIG, BIG], TensorProto.FLOAT, "x_s"),
           r"x_s")
model_case("init_undefined_type", _undefined_type, r"x_s|type")
model_case("init_bogus_type", _bogus_type, r"x_s|type")
model_case("init_string_weight", _string_weight, r"'w'|STRING|string|type|weights")
model_case("init_raw_and_typed_data", _raw_and_typed, r"x_s")
model_case("sparse_1e6x1e6", _sparse([10**6, 10**6], [1.0], [5]), r"'sp'.*limit|limit")
model_case("sparse_index_out_of_range", _sparse([1, 4], [1.0], [9]), r"\bsp")
model_case("sparse_negative_index", _sparse([1, 4], [1.0], [-2]), r"\bsp")
model_case("sparse_values_indices_mismatch", _sparse([1, 4], [1.0, 2.0], [1]), r"\bsp")
model_case("sparse_2d_indices_out_of_range", _sparse([1, 4], [1.0], np.array([[0, 7]])),
           r"\bsp")
model_case("sparse_ok", _sparse([1, 4], [1.0], [2]), r"", expect="ok")


# ---------------------------------------------------------------------------- external data
def _external(id: str, location: str, match: str, offset: int | None = None,
              length: int | None = None, prepare: Callable[[Path], None] | None = None,
              write_data: bool = True, expect: str = "error") -> None:
    def make(tmp: Path) -> list[str]:
        folder = tmp / "m"
        folder.mkdir()
        if prepare is not None:
            prepare(folder)
        return ["compile", str(bm.external_weight(folder, location, offset, length,
                                                  write_data))]
    CASES.append(Case(id, make, expect, match))


def _fifo(folder: Path) -> None:
    os.mkfifo(folder / "w.bin")


def _directory(folder: Path) -> None:
    (folder / "w.bin").mkdir()


def _symlink_out(folder: Path) -> None:
    (folder.parent / "outside.bin").write_bytes(bytes(108))
    (folder / "w.bin").symlink_to(folder.parent / "outside.bin")


def _symlink_in(folder: Path) -> None:
    (folder / "real.bin").write_bytes(base().graph.initializer[2].raw_data)
    (folder / "w.bin").symlink_to("real.bin")


def _symlink_dev_zero(folder: Path) -> None:
    (folder / "w.bin").symlink_to("/dev/zero")


def _symlink_dir_out(folder: Path) -> None:
    (folder.parent / "elsewhere").mkdir()
    (folder.parent / "elsewhere" / "w.bin").write_bytes(bytes(108))
    (folder / "sub").symlink_to(folder.parent / "elsewhere")


_external("external_ok", "w.bin", r"", expect="ok")
_external("external_ok_symlink_inside", "w.bin", r"", prepare=_symlink_in, write_data=False,
          expect="ok")
_external("external_fifo", "w.bin", r"'w'.*regular file", prepare=_fifo, write_data=False)
_external("external_directory", "w.bin", r"'w'.*regular file", prepare=_directory,
          write_data=False)
_external("external_dot", ".", r"'w'.*regular file", write_data=False)
_external("external_parent_escape", "../w.bin", r"'w'.*outside")
_external("external_absolute", "/etc/passwd", r"'w'.*outside", write_data=False)
_external("external_symlink_escape", "w.bin", r"'w'.*outside", prepare=_symlink_out,
          write_data=False)
_external("external_symlink_dev_zero", "w.bin", r"'w'.*outside|regular",
          prepare=_symlink_dev_zero, write_data=False)
_external("external_symlinked_dir_escape", "sub/w.bin", r"'w'.*outside",
          prepare=_symlink_dir_out, write_data=False)
_external("external_huge_length", "w.bin", r"'w'.*length|'w'.*bytes|limit", length=10**15)
_external("external_length_1e9", "w.bin", r"'w'", length=BIG)
_external("external_negative_offset", "w.bin", r"'w'.*offset", offset=-5)
_external("external_negative_length", "w.bin", r"'w'.*length", length=-5)
_external("external_offset_past_end", "w.bin", r"'w'", offset=10**6)
_external("external_offset_huge", "w.bin", r"'w'", offset=2**70)
_external("external_length_not_a_number", "w.bin", r"'w'.*offset|'w'.*length",
          prepare=None, length=None)
_external("external_length_short", "w.bin", r"\bw\b", length=50)
_external("external_missing_file", "w.bin", r"'w'.*cannot read|No such", write_data=False)
_external("external_empty_location", "", r"'w'.*location", write_data=False)
_external("external_nul_in_location", "w\0.bin", r"'w'", write_data=False)
_external("external_location_too_long", "b" * 5000, r"'w'", write_data=False)


def _external_bad_length_text(tmp: Path) -> list[str]:
    folder = tmp / "m"
    folder.mkdir()
    path = bm.external_weight(folder, "w.bin")
    m = onnx.load(str(path), load_external_data=False)
    w = next(t for t in m.graph.initializer if t.name == "w")
    w.external_data.add(key="length", value="12abc")
    path.write_bytes(m.SerializeToString())
    return ["compile", str(path)]


CASES[:] = [c for c in CASES if c.id != "external_length_not_a_number"]
CASES.append(Case("external_length_not_a_number", _external_bad_length_text, "error",
                  r"'w'.*length"))


def _external_in_memory_sparse(tmp: Path) -> list[str]:
    m = _sparse([1, 4], [1.0], [2])()
    values = m.graph.sparse_initializer[0].values
    (tmp / "v.bin").write_bytes(values.raw_data)
    values.ClearField("raw_data")
    values.data_location = TensorProto.EXTERNAL
    values.external_data.add(key="location", value="../../../etc/passwd")
    return ["compile", save(tmp, m)]


CASES.append(Case("external_sparse_values_escape", _external_in_memory_sparse, "error",
                  r"'sp'.*outside"))


# ---------------------------------------------------------------------------- attributes
for _id, _attrs, _match in [
    ("conv_strides_zero", {"strides": [0, 0]}, r"'conv'.*stride"),
    ("conv_strides_negative", {"strides": [-1, 1]}, r"'conv'.*stride"),
    ("conv_dilations_zero", {"dilations": [0, 1]}, r"'conv'.*dilation"),
    ("conv_pads_negative", {"pads": [-1, -1, -1, -1]}, r"'conv'.*pad"),
    ("conv_pads_1e9", {"pads": [BIG] * 4}, r"'conv'.*limit|limit"),
    ("conv_pads_wrong_length", {"pads": [1, 1]}, r"'conv'.*pad"),
    ("conv_group_zero", {"group": 0}, r"'conv'.*group"),
    ("conv_group_not_dividing", {"group": 2}, r"'conv'.*group|channel"),
    ("conv_group_1e9", {"group": BIG}, r"'conv'.*group"),
    ("conv_auto_pad_bogus", {"auto_pad": "SIDEWAYS"}, r"'conv'.*auto_pad|SIDEWAYS"),
    ("conv_kernel_shape_mismatch", {"kernel_shape": [5, 5]}, r"'conv'.*kernel"),
    ("conv_kernel_shape_rank", {"kernel_shape": [3, 3, 3]}, r"'conv'.*kernel|rank"),
    ("conv_kernel_shape_float", {"kernel_shape": [3.0, 3.0]}, r"'conv'|kernel"),
    ("conv_strides_huge", {"strides": [BIG, BIG]}, r"", ),
    ("conv_dilations_huge", {"dilations": [BIG, BIG]}, r"'conv'"),
]:
    if _id == "conv_strides_huge":  # legal: every output is one pixel
        model_case(_id, lambda a=_attrs: base(**a), r"", expect="ok")
        continue
    model_case(_id, lambda a=_attrs: base(**a), _match)

model_case("conv_weight_rank_3", _with_init(init("w", np.zeros((4, 3, 3)), np.int8)),
           r"'conv'|'wdq'|rank|weight")
model_case("conv_weight_channels_mismatch", _with_init(init("w", np.zeros((4, 5, 3, 3)),
                                                            np.int8)), r"'conv'.*channel")
model_case("conv_kernel_larger_than_input", lambda: base((1, 3, 2, 2), pads=[0, 0, 0, 0]),
           r"'conv'")


def _conv_1e9_channels() -> onnx.ModelProto:
    """Channels from a 1-element weight broadcast by Expand to (1e9, 3, 3, 3)."""
    m = base()
    node(m, "conv").input[1] = "wx"
    m.graph.initializer.append(init("wshape", [BIG, 3, 3, 3], np.int64))
    m.graph.node.insert(3, helper.make_node("Expand", ["wd", "wshape"], ["wx"], name="expand"))
    return m


model_case("conv_1e9_output_channels", _conv_1e9_channels, r"'expand'")


def _pool(op: str, **attrs: object) -> Callable[[], onnx.ModelProto]:
    return lambda: single(op, {"x": f32(1, 3, 8, 8)}, **attrs)


model_case("maxpool_no_kernel_shape", _pool("MaxPool"), r"'n'.*kernel_shape")
model_case("maxpool_kernel_zero", _pool("MaxPool", kernel_shape=[0, 0]), r"'n'.*kernel")
model_case("maxpool_kernel_larger_than_input", _pool("MaxPool", kernel_shape=[9, 9]), r"'n'")
model_case("maxpool_pads_1e9", _pool("MaxPool", kernel_shape=[2, 2], pads=[BIG] * 4),
           r"'n'.*limit|limit|pad")
model_case("avgpool_strides_zero", _pool("AveragePool", kernel_shape=[2, 2], strides=[0, 0]),
           r"'n'.*stride")
model_case("avgpool_kernel_negative", _pool("AveragePool", kernel_shape=[-2, 2]), r"'n'")
model_case("maxpool_storage_order_absurd", _pool("MaxPool", kernel_shape=[2, 2],
                                                 storage_order=7), "", expect="ok")
model_case("softmax_axis_out_of_range",
           lambda: single("Softmax", {"x": f32(1, 10)}, axis=5), r"'n'.*axis")
model_case("concat_axis_out_of_range",
           lambda: single("Concat", {"x": f32(1, 4), "z": f32(1, 4)}, axis=9), r"'n'.*axis")
model_case("concat_rank_mismatch",
           lambda: single("Concat", {"x": f32(1, 4), "z": f32(1, 4, 1)}, axis=1), r"'n'")
model_case("concat_shape_mismatch",
           lambda: single("Concat", {"x": f32(1, 4), "z": f32(2, 4)}, axis=1), r"'n'")
model_case("concat_no_axis", lambda: single("Concat", {"x": f32(1, 4), "z": f32(1, 4)}),
           r"'n'.*axis")
model_case("reshape_two_minus_one", lambda: single(
    "Reshape", {"x": f32(2, 6)}, [init("s", [-1, -1], np.int64)], ["s"]), r"'n'|-1")
model_case("reshape_size_mismatch", lambda: single(
    "Reshape", {"x": f32(2, 6)}, [init("s", [5, 5], np.int64)], ["s"]), r"'n'")
model_case("reshape_huge", lambda: single(
    "Reshape", {"x": f32(2, 6)}, [init("s", [BIG, BIG], np.int64)], ["s"]), r"'n'")
model_case("transpose_perm_duplicate",
           lambda: single("Transpose", {"x": f32(2, 3, 4)}, perm=[0, 0, 1]), r"'n'.*perm")
model_case("transpose_perm_length",
           lambda: single("Transpose", {"x": f32(2, 3, 4)}, perm=[1, 0]), r"'n'.*perm")
model_case("transpose_perm_out_of_range",
           lambda: single("Transpose", {"x": f32(2, 3, 4)}, perm=[0, 1, 9]), r"'n'.*perm")
model_case("matmul_shape_mismatch",
           lambda: single("MatMul", {"x": f32(2, 3), "z": f32(4, 5)}), r"'n'")
model_case("gemm_shape_mismatch", lambda: single(
    "Gemm", {"x": f32(2, 3)}, [init("b", np.zeros((4, 5)), np.float32)], ["b"]), r"'n'")
model_case("gemm_rank_3", lambda: single(
    "Gemm", {"x": f32(2, 3, 4)}, [init("b", np.zeros((4, 5)), np.float32)], ["b"]), r"'n'")
model_case("add_broadcast_mismatch",
           lambda: single("Add", {"x": f32(2, 3), "z": f32(4, 5)}), r"'n'")


def _resize(scales: list[float] | None = None, sizes: list[int] | None = None,
            **attrs: object) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        inits = [init("roi", np.zeros(0), np.float32)]
        names = ["roi"]
        if scales is not None:
            inits.append(init("scales", scales, np.float32))
            names.append("scales")
        if sizes is not None:
            inits.append(init("scales", np.zeros(0), np.float32))
            inits.append(init("sizes", sizes, np.int64))
            names += ["scales", "sizes"]
        return single("Resize", {"x": f32(1, 3, 8, 8)}, inits, names, **attrs)
    return build


model_case("resize_scales_1e5", _resize([1, 1, 1e5, 1e5]), r"'n'.*limit|limit")
model_case("resize_scales_zero", _resize([1, 1, 0, 0]), r"'n'.*scale|'n'")
model_case("resize_scales_negative", _resize([1, 1, -2, -2]), r"'n'.*scale|'n'")
model_case("resize_scales_nan", _resize([1, 1, np.nan, 2]), r"'n'.*scale|'n'")
model_case("resize_scales_inf", _resize([1, 1, np.inf, 2]), r"'n'.*scale|'n'|limit")
model_case("resize_scales_wrong_length", _resize([2, 2]), r"'n'")
model_case("resize_sizes_huge", _resize(sizes=[1, 3, 10**6, 10**6]), r"'n'.*limit|limit")
model_case("resize_mode_bogus", _resize([1, 1, 2, 2], mode="quadratic"), r"'n'.*mode|quadratic")
model_case("pad_1e9", lambda: single(
    "Pad", {"x": f32(1, 3, 8, 8)}, [init("p", [0, 0, BIG, BIG, 0, 0, BIG, BIG], np.int64)],
    ["p"]), r"'n'.*limit|limit")
model_case("pad_negative_beyond_size", lambda: single(
    "Pad", {"x": f32(1, 3, 8, 8)}, [init("p", [0, 0, -9, 0, 0, 0, 0, 0], np.int64)], ["p"]),
    r"'n'")
model_case("pad_wrong_length", lambda: single(
    "Pad", {"x": f32(1, 3, 8, 8)}, [init("p", [1, 1, 1], np.int64)], ["p"]), r"'n'")
model_case("pad_mode_bogus", lambda: single(
    "Pad", {"x": f32(1, 3, 8, 8)}, [init("p", [0] * 8, np.int64)], ["p"], mode="mirror"),
    r"'n'.*mode|mirror")
model_case("slice_step_zero", lambda: single(
    "Slice", {"x": f32(4, 4)}, [init("st", [0], np.int64), init("en", [4], np.int64),
                                init("ax", [0], np.int64), init("sp", [0], np.int64)],
    ["st", "en", "ax", "sp"]), r"'n'.*step")
model_case("slice_axis_out_of_range", lambda: single(
    "Slice", {"x": f32(4, 4)}, [init("st", [0], np.int64), init("en", [4], np.int64),
                                init("ax", [5], np.int64)], ["st", "en", "ax"]), r"'n'.*axis")
model_case("split_sizes_do_not_sum", lambda: single(
    "Split", {"x": f32(4, 6)}, [init("sp", [2, 2], np.int64)], ["sp"], n_outputs=2, axis=1),
    r"'n'")
model_case("flatten_axis_out_of_range",
           lambda: single("Flatten", {"x": f32(2, 3)}, axis=7), r"'n'.*axis")
model_case("squeeze_non_one_dim", lambda: single(
    "Squeeze", {"x": f32(2, 3)}, [init("ax", [0], np.int64)], ["ax"]), r"'n'")
model_case("unsqueeze_axis_huge", lambda: single(
    "Unsqueeze", {"x": f32(2, 3)}, [init("ax", [BIG], np.int64)], ["ax"]), r"'n'.*axis|'n'")
model_case("cast_to_bogus", lambda: single("Cast", {"x": f32(2, 3)}, to=99), r"'n'|99|type")
model_case("cast_to_string", lambda: single("Cast", {"x": f32(2, 3)}, to=TensorProto.STRING),
           r"'n'|STRING|string")
model_case("leaky_relu_alpha_nan_ok", lambda: single("LeakyRelu", {"x": f32(2, 3)},
                                                     alpha=float("nan")), r"", expect="ok")
model_case("clip_min_above_max_ok", lambda: single(
    "Clip", {"x": f32(2, 3)}, [init("lo", 2.0, np.float32), init("hi", 1.0, np.float32)],
    ["lo", "hi"]), r"", expect="ok")
model_case("batchnorm_wrong_param_length", lambda: single(
    "BatchNormalization", {"x": f32(1, 3, 4, 4)},
    [init(n, np.ones(5), np.float32) for n in ("g", "b", "m", "v")], ["g", "b", "m", "v"]),
    r"'n'")
model_case("attr_wrong_type", lambda: single("Softmax", {"x": f32(1, 10)}, axis=1.5),
           r"'n'|axis")
model_case("attr_unknown", lambda: single("Relu", {"x": f32(1, 10)}, frobnicate=3),
           r"'n'|frobnicate|rejects")


def _folded(op: str, consts: list[onnx.TensorProto], **attrs: object
            ) -> Callable[[], onnx.ModelProto]:
    """``op`` on constants only (folded at import), its result added to input x."""
    def build() -> onnx.ModelProto:
        nodes = [helper.make_node(op, [t.name for t in consts], ["k"], name="fold", **attrs),
                 helper.make_node("Add", ["x", "k"], ["y"], name="add")]
        return bm.graph_model(nodes, [helper.make_tensor_value_info("x", 1, [1, 4])],
                              [helper.make_tensor_value_info("y", 1, None)], consts)
    return build


model_case("constant_of_shape_1e9x1e9", _folded(
    "ConstantOfShape", [init("shp", [BIG, BIG], np.int64)]), r"'fold'.*limit|limit")
model_case("constant_of_shape_negative", _folded(
    "ConstantOfShape", [init("shp", [-3, 4], np.int64)]), r"'fold'")
model_case("expand_1e5x1e5", _folded(
    "Expand", [init("v", [1.0], np.float32), init("shp", [10**5, 10**5], np.int64)]),
    r"'fold'.*limit|limit")
model_case("tile_repeats_1e9", _folded(
    "Tile", [init("v", np.ones((1, 4)), np.float32), init("rep", [BIG, 1], np.int64)]),
    r"'fold'.*limit|limit")
model_case("range_1e12", _folded(
    "Range", [init("a", 0.0, np.float32), init("b", 1e12, np.float32),
              init("d", 1.0, np.float32)]), r"'fold'.*limit|limit")
model_case("gather_index_out_of_range", _folded(
    "Gather", [init("v", np.ones(4), np.float32), init("i", [9], np.int64)]), r"'fold'")
model_case("constant_two_values", lambda: _constant_node(value_float=1.0, value_int=2),
           r"'c'.*Constant|'c'")
model_case("constant_no_value", lambda: _constant_node(), r"'c'")


# ------------------------------------------------------------- dynamic quantization
def _dynamic(x_type: int = TensorProto.FLOAT, zp_cast: int | None = None,
             zw: np.ndarray | None = None) -> Callable[[], onnx.ModelProto]:
    """DynamicQuantizeLinear → MatMulInteger, with the parts a test breaks."""
    def build() -> onnx.ModelProto:
        zp = "z"
        nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dql")]
        if zp_cast is not None:
            nodes.append(helper.make_node("Cast", ["z"], ["zc"], to=zp_cast))
            zp = "zc"
        inputs = ["q", "w", zp] + (["zw"] if zw is not None else [])
        nodes.append(helper.make_node("MatMulInteger", inputs, ["y"], name="mmi"))
        inits = [init("w", np.ones((4, 3)), np.int8)]
        if zw is not None:
            inits.append(init("zw", zw, np.int8))
        return bm.graph_model(nodes, [helper.make_tensor_value_info("x", x_type, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3])],
                              inits)
    return build


model_case("dynamic_quantize_int_input", _dynamic(x_type=TensorProto.INT32), r"'dql'.*float32")
model_case("dynamic_zero_point_other_type", _dynamic(zp_cast=TensorProto.INT8),
           r"'mmi'.*zero point")
model_case("dynamic_weight_zero_point_shape", _dynamic(zw=np.zeros(5)), r"'mmi'.*zero point")


def _constant_node(**attrs: object) -> onnx.ModelProto:
    nodes = [helper.make_node("Constant", [], ["k"], name="c", **attrs),
             helper.make_node("Add", ["x", "k"], ["y"], name="add")]
    return bm.graph_model(nodes, [helper.make_tensor_value_info("x", 1, [1, 4])],
                          [helper.make_tensor_value_info("y", 1, None)], [])


# ---------------------------------------------------------------------------- the CLI
def _model(tmp: Path) -> str:
    return save(tmp, base())


def cli_case(id: str, expect: str, match: str = "") -> Callable[[Callable[[Path], list[str]]],
                                                               Callable[[Path], list[str]]]:
    return case(f"cli_{id}", expect, match)


@cli_case("run_inputs_npy", "error", r"\.npy|npz")
def _(tmp: Path) -> list[str]:
    np.save(tmp / "x.npy", good_x())
    return ["run", _model(tmp), "--inputs", str(tmp / "x.npy")]


@cli_case("run_inputs_missing_file", "error", r"No such file|missing|not found")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", str(tmp / "none.npz")]


@cli_case("run_inputs_directory", "error", r"director")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", str(tmp)]


@cli_case("run_inputs_garbage", "error", r"in\.npz|npz|not")
def _(tmp: Path) -> list[str]:
    (tmp / "in.npz").write_bytes(b"garbage" * 100)
    return ["run", _model(tmp), "--inputs", str(tmp / "in.npz")]


@cli_case("run_inputs_empty_file", "error", r"in\.npz|npz|empty")
def _(tmp: Path) -> list[str]:
    (tmp / "in.npz").write_bytes(b"")
    return ["run", _model(tmp), "--inputs", str(tmp / "in.npz")]


@cli_case("run_inputs_object_array", "error", r"'x'|object|pickle")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", npz(tmp, x=np.array([{"a": 1}], dtype=object))]


@cli_case("run_inputs_missing_name", "error", r"lacks.*'x'|missing")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", npz(tmp, other=good_x())]


@cli_case("run_inputs_extra_name", "error", r"unknown input.*extra")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", npz(tmp, x=good_x(), extra=good_x())]


@cli_case("run_inputs_wrong_shape", "error", r"'x'.*shape|'x'")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", npz(tmp, x=np.zeros((1, 3, 9, 9), np.float32))]


@cli_case("run_inputs_wrong_rank", "error", r"'x'")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", npz(tmp, x=np.zeros((3, 8, 8), np.float32))]


@cli_case("run_inputs_float64", "error", r"'x'.*float")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", npz(tmp, x=good_x().astype(np.float64))]


@cli_case("run_inputs_int", "error", r"'x'")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", npz(tmp, x=np.zeros((1, 3, 8, 8), np.int64))]


@cli_case("run_inputs_scalar", "error", r"'x'")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", npz(tmp, x=np.float32(1.0))]


@cli_case("run_inputs_nan_ok", "ok")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", npz(tmp, x=np.full((1, 3, 8, 8), np.nan,
                                                                np.float32))]


@cli_case("run_inputs_inf_ok", "ok")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--inputs", npz(tmp, x=np.full((1, 3, 8, 8), np.inf,
                                                                np.float32))]


@cli_case("run_reference_wrong_shape", "error", r"'x'")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--mode", "reference", "--inputs",
            npz(tmp, x=np.zeros((1, 3, 9, 9), np.float32))]


@cli_case("run_reference_wrong_dtype", "error", r"'x'")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--mode", "reference", "--inputs",
            npz(tmp, x=good_x().astype(np.float64))]


@cli_case("run_reference_extra_name", "error", r"extra")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--mode", "reference", "--inputs",
            npz(tmp, x=good_x(), extra=good_x())]


@cli_case("run_emulate_wrong_shape", "error", r"'x'")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--emulate", "onnxruntime", "--inputs",
            npz(tmp, x=np.zeros((1, 3, 9, 9), np.float32))]


@cli_case("run_output_under_a_file", "error", r"out|director")
def _(tmp: Path) -> list[str]:
    (tmp / "file").write_text("x")
    return ["run", _model(tmp), "--output", str(tmp / "file" / "out.npz")]


@cli_case("run_output_is_a_directory", "error", r"director")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--output", str(tmp)]


@cli_case("run_output_missing_folder", "error", r"folder does not exist")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--output", str(tmp / "a" / "b" / "out.npz")]


@cli_case("run_output_unwritable", "error", r"Permission|Read-only|denied|not permitted|/proc")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--output", "/proc/version"]


@cli_case("run_mode_bogus", "usage")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--mode", "turbo"]


@cli_case("run_threads_zero", "error", r"threads")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--threads", "0"]


@cli_case("run_threads_negative", "error", r"threads")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--threads", "-4"]


@cli_case("run_threads_absurd", "error", r"threads")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--threads", str(BIG)]


@cli_case("run_threads_not_a_number", "usage")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--threads", "many"]


@cli_case("run_input_shape_syntax", "usage")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--input-shape", "x:1,3,8,8"]


@cli_case("run_input_shape_unknown_name", "error", r"'?nope'?")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--input-shape", "nope=1x3x8x8"]


@cli_case("run_input_shape_disagrees", "error", r"'x'")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--input-shape", "x=1x3x9x9"]


@cli_case("run_input_shape_huge", "error", r"'x'.*limit|limit")
def _(tmp: Path) -> list[str]:
    m = base((1, 3, "H", "W"))
    return ["run", save(tmp, m), "--input-shape", f"x=1x3x{10**5}x{10**5}"]


@cli_case("run_input_shape_zero", "error", r"'x'|conv|0")
def _(tmp: Path) -> list[str]:
    m = base((1, 3, "H", "W"))
    return ["run", save(tmp, m), "--input-shape", "x=1x3x0x8"]


@cli_case("compile_json_under_a_file", "error", r"plan\.json|director")
def _(tmp: Path) -> list[str]:
    (tmp / "file").write_text("x")
    return ["compile", _model(tmp), "--json", str(tmp / "file" / "plan.json")]


@cli_case("compile_json_unwritable", "error", r"Permission|denied|not permitted|/proc")
def _(tmp: Path) -> list[str]:
    return ["compile", _model(tmp), "--json", "/proc/version"]


@cli_case("compile_json_directory", "error", r"director")
def _(tmp: Path) -> list[str]:
    return ["compile", _model(tmp), "--json", str(tmp)]


@cli_case("compile_mode_reference", "usage")
def _(tmp: Path) -> list[str]:
    return ["compile", _model(tmp), "--mode", "reference"]


@cli_case("inspect_json_unwritable", "error", r"Permission|denied|not permitted|/proc")
def _(tmp: Path) -> list[str]:
    return ["inspect", _model(tmp), "--json", "/proc/version"]


@cli_case("inspect_error_inputs_npy", "ok")  # a .npy feeds a single-input model
def _(tmp: Path) -> list[str]:
    np.save(tmp / "x.npy", good_x())
    return ["inspect", _model(tmp), "--error", "--inputs", str(tmp / "x.npy")]


@cli_case("inspect_error_inputs_wrong_shape", "error", r"'x'")
def _(tmp: Path) -> list[str]:
    return ["inspect", _model(tmp), "--error", "--inputs",
            npz(tmp, x=np.zeros((1, 3, 9, 9), np.float32))]


for _iters in ("0", "-1", "-100"):
    def _bench_iters(tmp: Path, iters: str = _iters) -> list[str]:
        return ["bench", _model(tmp), "--compare", "unfused", "--iters", iters]
    CASES.append(Case(f"cli_bench_iters_{_iters}", _bench_iters, "error", r"iters"))

for _batch in ("0", "-2"):
    def _bench_batch(tmp: Path, batch: str = _batch) -> list[str]:
        return ["bench", _model(tmp), "--compare", "unfused", "--iters", "1", "--batch", batch]
    CASES.append(Case(f"cli_bench_batch_{_batch}", _bench_batch, "error", r"batch"))


@cli_case("bench_threads_zero", "error", r"threads")
def _(tmp: Path) -> list[str]:
    return ["bench", _model(tmp), "--compare", "unfused", "--iters", "1", "--threads", "0"]


@cli_case("bench_compare_bogus", "usage")
def _(tmp: Path) -> list[str]:
    return ["bench", _model(tmp), "--compare", "tensorrt"]


@cli_case("bench_json_unwritable", "error", r"Permission|denied|not permitted|/proc")
def _(tmp: Path) -> list[str]:
    return ["bench", _model(tmp), "--compare", "unfused", "--iters", "1", "--json",
            "/proc/version"]


@cli_case("bench_plot_under_a_file", "error", r"plot|director|png")
def _(tmp: Path) -> list[str]:
    (tmp / "file").write_text("x")
    return ["bench", _model(tmp), "--compare", "unfused", "--iters", "1", "--plot",
            str(tmp / "file" / "p.png")]


@cli_case("compare_emulate_bogus", "usage")
def _(tmp: Path) -> list[str]:
    return ["compare", _model(tmp), "--emulate", "tensorrt"]


@cli_case("compare_inputs_npy", "error", r"\.npy|npz")
def _(tmp: Path) -> list[str]:
    np.save(tmp / "x.npy", good_x())
    return ["compare", _model(tmp), "--emulate", "onnxruntime", "--inputs", str(tmp / "x.npy")]


@cli_case("compare_inputs_wrong_dtype", "error", r"'x'")
def _(tmp: Path) -> list[str]:
    return ["compare", _model(tmp), "--emulate", "onnxruntime", "--inputs",
            npz(tmp, x=good_x().astype(np.float64))]


@cli_case("quantize_missing_calibration", "error", r"calib|No such")
def _(tmp: Path) -> list[str]:
    return ["quantize", _float_model(tmp), str(tmp / "out.onnx"), "--calibration",
            str(tmp / "none.npz")]


@cli_case("quantize_calibration_wrong_shape", "error", r"'x'")
def _(tmp: Path) -> list[str]:
    return ["quantize", _float_model(tmp), str(tmp / "out.onnx"), "--calibration",
            npz(tmp, x=np.zeros((4, 3, 9, 9), np.float32))]


@cli_case("quantize_calibration_missing_input", "error", r"'x'|lacks|missing")
def _(tmp: Path) -> list[str]:
    return ["quantize", _float_model(tmp), str(tmp / "out.onnx"), "--calibration",
            npz(tmp, other=np.zeros((4, 3, 8, 8), np.float32))]


@cli_case("quantize_output_under_a_file", "error", r"out\.onnx|director")
def _(tmp: Path) -> list[str]:
    (tmp / "file").write_text("x")
    return ["quantize", _float_model(tmp), str(tmp / "file" / "out.onnx"), "--calibration",
            npz(tmp, x=np.zeros((4, 3, 8, 8), np.float32))]


@cli_case("quantize_method_bogus", "usage")
def _(tmp: Path) -> list[str]:
    return ["quantize", _float_model(tmp), str(tmp / "out.onnx"), "--calibration",
            npz(tmp, x=np.zeros((4, 3, 8, 8), np.float32)), "--method", "guess"]


@cli_case("quantize_model_directory", "error", r"director")
def _(tmp: Path) -> list[str]:
    return ["quantize", str(tmp), str(tmp / "out.onnx"), "--calibration",
            npz(tmp, x=np.zeros((4, 3, 8, 8), np.float32))]


def _float_model(tmp: Path) -> str:
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    m = single("Conv", {"x": f32(1, 3, 8, 8)}, [init("w", w)], ["w"], pads=[1, 1, 1, 1])
    return save(tmp, m, "float.onnx")


@cli_case("no_command", "usage")
def _(tmp: Path) -> list[str]:
    return []


@cli_case("unknown_command", "usage")
def _(tmp: Path) -> list[str]:
    return ["explode", _model(tmp)]


@cli_case("run_without_model", "usage")
def _(tmp: Path) -> list[str]:
    return ["run"]


@cli_case("unknown_flag", "usage")
def _(tmp: Path) -> list[str]:
    return ["run", _model(tmp), "--turbo"]


# ---------------------------------------------------------------------------- the campaign
class Worker:
    """bad_input_worker.py in a subprocess; restarted after a hang or a crash."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.compiler.bad_input_worker"], cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        assert json.loads(self._readline(120.0) or "{}").get("ready"), "worker did not start"

    def _readline(self, timeout: float) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else None

    def run(self, argv: list[str], cwd: Path) -> dict[str, object]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd)}) + "\n")
        self.proc.stdin.flush()
        line = self._readline(TIMEOUT)
        if line is None:
            self.stop()
            return {"code": "hang", "stdout": "", "stderr": ""}
        if not line:
            code = self.proc.wait()
            self.proc = None
            return {"code": f"crash (signal {-code})" if code < 0 else f"died ({code})",
                    "stdout": "", "stderr": ""}
        return json.loads(line)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="module")
def worker() -> Worker:
    w = Worker()
    yield w
    w.stop()


def test_the_campaign_is_broad() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    assert len(ids) >= 140


@pytest.mark.parametrize("bad", CASES, ids=[c.id for c in CASES])
def test_bad_input(bad: Case, worker: Worker, tmp_path: Path) -> None:
    argv = bad.make(tmp_path)
    result = worker.run(argv, tmp_path)
    code, stderr = result["code"], str(result["stderr"])
    lines = [line for line in stderr.splitlines() if line.strip()]
    shown = f"qfuse {' '.join(argv)[:200]} -> exit {code}\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, shown
    if bad.expect == "usage":
        assert code == 2, shown
        return
    if bad.expect == "ok":
        assert code == 0, shown
        return
    assert code == 1, shown
    assert len(lines) == 1, shown
    assert "internal error" not in lines[0], shown
    assert re.match(r"qfuse \w+: \w+(Error|Exception)?: ", lines[0]), shown
    assert re.search(bad.match, lines[0], re.IGNORECASE), f"no /{bad.match}/ in: {lines[0]}"


# ---------------------------------------------------------------------------- behaviours
@pytest.mark.parametrize("scale", [3e38, 1e31, 1e-45, np.inf])
def test_extreme_scales_run_in_float_and_match(scale: float) -> None:
    """A scale outside [MIN_SCALE, MAX_SCALE] never reaches the int8 kernels. A finite one
    above MAX_SCALE, its QuantizeLinear read only by its DequantizeLinear, is the pair in
    float32 (one kernel, no island); +inf (quantize_static's for a tensor holding -inf, a
    GPT-style causal mask) and a denormal one are onnxruntime islands. Fused, unfused and
    reference give the same outputs (before, 3e38 gave inf where the reference gives 0)."""
    from qfuse.compiler.api import compile_model

    m = bm.replace_init(base(), init("x_s", scale, np.float32))
    x = good_x()
    reference = compile_model(m, mode="reference").run({"x": x})["y"]
    for mode in ("fused", "unfused"):
        compiled = compile_model(m, mode=mode)
        islands = compiled.inspect()["islands"]
        island = any(i["ops"] and "QuantizeLinear" in i["ops"] for i in islands)
        assert island == (not np.isfinite(scale) or scale < 1), islands
        got = compiled.run({"x": x})["y"]
        if scale == np.inf:
            # x / inf quantizes to the zero point and (q - zp) · inf is NaN: onnxruntime and
            # the reference give NaN through the conv and its ReLU; oneDNN's fused ReLU
            # maps NaN to 0 (README, "NaN made inside the graph")
            assert np.isnan(reference).all() and np.array_equal(got, np.zeros_like(got))
        elif scale >= np.finfo(np.float32).tiny:
            np.testing.assert_array_equal(got, reference)
        else:  # the conv's products are subnormal: each sum of 27 loses a few of the 2^-149
            # steps that subnormals hold, differently in oneDNN's order and numpy's
            np.testing.assert_allclose(got, reference, rtol=0, atol=32 * 2.0**-149)


@pytest.mark.parametrize("limit", ["1000", "1e3"])
def test_the_tensor_limit_is_configurable(limit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from qfuse.compiler.api import compile_model
    from qfuse.compiler.errors import SizeLimitError

    compile_model(base())  # 1x3x8x8 float: 768 bytes, the conv output 1 KiB
    monkeypatch.setenv("QFUSE_MAX_TENSOR_BYTES", limit)
    with pytest.raises(SizeLimitError, match=r"node 'conv' \(Conv\): output 'c' .* needs 1 KiB"):
        compile_model(base())
    monkeypatch.setenv("QFUSE_MAX_TENSOR_BYTES", "-1")
    with pytest.raises(SizeLimitError, match="QFUSE_MAX_TENSOR_BYTES"):
        compile_model(base())


def test_the_model_limit_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    from qfuse.compiler.api import compile_model
    from qfuse.compiler.errors import SizeLimitError

    monkeypatch.setenv("QFUSE_MAX_MODEL_BYTES", "2000")
    with pytest.raises(SizeLimitError, match="QFUSE_MAX_MODEL_BYTES"):
        compile_model(base())
