"""Every value the binding hard-codes, checked against the installed oneDNN 3.2 headers.

The headers come from onednn-devel-cpu-gomp (include/oneapi/dnnl/*.h), found through
importlib.metadata. Enums are parsed as C does: `name = expr,` or `name,` (previous + 1), with
`#ifdef X` blocks kept when dnnl_config.h defines X; `#define DNNL_ARG_*` values are resolved
through other defines. Struct sizes are checked with ctypes.sizeof.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import re
from enum import Enum
from functools import cache
from pathlib import Path

import pytest

from qfuse.runtime.onednn import _lib
from qfuse.runtime.onednn.enums import (
    Alg,
    Arg,
    CpuIsa,
    DataType,
    EngineKind,
    FormatKind,
    FormatTag,
    FpMathMode,
    NormFlags,
    PrimitiveKind,
    PropKind,
    Query,
    ScratchpadMode,
    Status,
    StreamFlags,
)

HEADERS = ("dnnl_common_types.h", "dnnl_types.h", "dnnl.h", "dnnl_config.h")


@cache
def header_dir() -> Path:
    try:
        files = importlib.metadata.files("onednn-devel-cpu-gomp") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("onednn-devel-cpu-gomp (the headers) is not installed")
    for entry in files:
        if str(entry).endswith("oneapi/dnnl/dnnl_types.h"):
            return Path(str(entry.locate())).parent
    pytest.fail("onednn-devel-cpu-gomp has no include/oneapi/dnnl/dnnl_types.h")


def _strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", text)


@cache
def config_defines() -> frozenset[str]:
    text = _strip((header_dir() / "dnnl_config.h").read_text())
    return frozenset(re.findall(r"^\s*#\s*define\s+(\w+)", text, flags=re.MULTILINE))


def _active_lines(text: str) -> list[str]:
    """Lines outside #ifdef/#if 0 blocks whose condition dnnl_config.h does not define."""
    keep, stack = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if match := re.match(r"#\s*ifdef\s+(\w+)", stripped):
            stack.append(match.group(1) in config_defines())
        elif match := re.match(r"#\s*ifndef\s+(\w+)", stripped):
            stack.append(match.group(1) not in config_defines())
        elif re.match(r"#\s*if\b", stripped):
            stack.append(stripped not in ("#if 0",))
        elif re.match(r"#\s*else\b", stripped) and stack:
            stack[-1] = not stack[-1]
        elif re.match(r"#\s*endif\b", stripped) and stack:
            stack.pop()
        elif all(stack):
            keep.append(line)
    return keep


def _evaluate(expr: str, names: dict[str, int]) -> int:
    expr = re.sub(r"(?<=\d)[uU]\b", "", expr.strip())
    expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: str(names[m.group(0)]), expr)
    if not re.fullmatch(r"[\d\sxXa-fA-F+\-*|<>()]+", expr):
        raise ValueError(f"unsupported expression {expr!r}")
    return int(eval(expr, {"__builtins__": {}}))  # checked above: digits and operators only


@cache
def c_enums() -> dict[str, dict[str, int]]:
    """typedef name -> {enumerator: value} for every enum in the headers."""
    enums: dict[str, dict[str, int]] = {}
    for header in HEADERS:
        text = "\n".join(_active_lines(_strip((header_dir() / header).read_text())))
        for body, name in re.findall(r"typedef\s+enum\s*\w*\s*\{(.*?)\}\s*(\w+)\s*;", text,
                                     flags=re.DOTALL):
            values: dict[str, int] = {}
            following = 0
            for item in (i.strip() for i in body.split(",")):
                if not item:
                    continue
                key, _, expr = (part.strip() for part in item.partition("="))
                scope = {**{k: v for e in enums.values() for k, v in e.items()}, **values}
                following = _evaluate(expr, scope) if expr else following
                values[key] = following
                following += 1
            enums[name] = values
    return enums


@cache
def c_defines() -> dict[str, int]:
    raw: dict[str, str] = {}
    for header in HEADERS:
        text = _strip((header_dir() / header).read_text()).replace("\\\n", " ")
        for name, expr in re.findall(r"^\s*#\s*define\s+(DNNL_ARG_\w+|DNNL_MAX_NDIMS)\s+(.+)$",
                                     text, flags=re.MULTILINE):
            raw[name] = expr
    resolved: dict[str, int] = {}
    for name, expr in raw.items():
        if "(" in name or "idx" in expr:
            continue
        resolved[name] = _resolve(name, raw)
    return resolved


def _resolve(name: str, raw: dict[str, str]) -> int:
    expr = raw[name]
    names = {ref: _resolve(ref, raw) for ref in re.findall(r"\b[A-Z_][A-Z0-9_]+\b", expr)
             if ref in raw}
    return _evaluate(expr, names)


def _default_c_name(member: Enum) -> str:
    return f"dnnl_{member.name}"


# enum class -> (C typedef, member -> C enumerator name)
ENUMS: dict[type[Enum], tuple[str, dict[str, str]]] = {
    Status: ("dnnl_status_t", {}),
    DataType: ("dnnl_data_type_t", {"undef": "dnnl_data_type_undef"}),
    FormatKind: ("dnnl_format_kind_t", {"undef": "dnnl_format_kind_undef",
                                        "any": "dnnl_format_kind_any",
                                        "opaque": "dnnl_format_kind_opaque"}),
    FormatTag: ("dnnl_format_tag_t", {"undef": "dnnl_format_tag_undef",
                                      "any": "dnnl_format_tag_any"}),
    PropKind: ("dnnl_prop_kind_t", {"undef": "dnnl_prop_kind_undef"}),
    PrimitiveKind: ("dnnl_primitive_kind_t", {}),
    Alg: ("dnnl_alg_kind_t", {"undef": "dnnl_alg_kind_undef"}),
    Query: ("dnnl_query_t", {}),
    EngineKind: ("dnnl_engine_kind_t", {"any": "dnnl_any_engine"}),
    StreamFlags: ("dnnl_stream_flags_t", {}),
    ScratchpadMode: ("dnnl_scratchpad_mode_t", {}),
    FpMathMode: ("dnnl_fpmath_mode_t", {}),
    NormFlags: ("dnnl_normalization_flags_t", {"none": "dnnl_normalization_flags_none"}),
    CpuIsa: ("dnnl_cpu_isa_t", {}),
}
PREFIXES = {Query: "dnnl_query_", StreamFlags: "dnnl_stream_",
            ScratchpadMode: "dnnl_scratchpad_mode_", FpMathMode: "dnnl_fpmath_mode_",
            CpuIsa: "dnnl_cpu_isa_"}


@pytest.mark.parametrize("enum_class", list(ENUMS), ids=lambda e: e.__name__)
def test_enum_values_match_headers(enum_class: type[Enum]) -> None:
    typedef, renames = ENUMS[enum_class]
    c_values = c_enums()[typedef]
    prefix = PREFIXES.get(enum_class, "dnnl_")
    for name, member in enum_class.__members__.items():  # includes aliases
        c_name = renames.get(name, prefix + name)
        assert c_name in c_values, f"{enum_class.__name__}.{name}: no {c_name} in {typedef}"
        assert int(member.value) == c_values[c_name], f"{enum_class.__name__}.{name}"


def test_format_tag_aliases_match_headers() -> None:
    c_values = c_enums()["dnnl_format_tag_t"]
    for alias in ("nchw", "nhwc", "oihw", "goihw", "ncdhw", "ndhwc", "nc", "x", "io", "hwio"):
        assert FormatTag[alias] == c_values[f"dnnl_{alias}"], alias


@pytest.mark.parametrize("member", list(Arg.__members__), ids=str)
def test_arg_defines_match_headers(member: str) -> None:
    assert int(Arg[member]) == c_defines()[f"DNNL_ARG_{member}"]


def test_arg_helpers_follow_the_macros() -> None:
    defines = c_defines()
    base = defines["DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE"]
    for index in range(4):
        assert Arg.attr_multiple_post_op(index) == base * (index + 1)  # the C macro's formula
    assert Arg.post_op(2, Arg.SRC_1) == base * 3 | defines["DNNL_ARG_SRC_1"]
    assert Arg.scales(Arg.WEIGHTS) == defines["DNNL_ARG_ATTR_SCALES"] | defines["DNNL_ARG_WEIGHTS"]
    assert Arg.zero_points(Arg.DST) == (defines["DNNL_ARG_ATTR_ZERO_POINTS"]
                                        | defines["DNNL_ARG_DST"])
    assert Arg.multiple_src(3) == defines["DNNL_ARG_MULTIPLE_SRC"] + 3


def test_sizes_and_dims() -> None:
    assert c_defines()["DNNL_MAX_NDIMS"] == _lib.MAX_NDIMS == 12
    assert ctypes.sizeof(_lib.Dims) == 12 * 8
    assert ctypes.sizeof(_lib.ExecArg) == 16
    assert _lib.ExecArg.memory.offset == 8
    assert ctypes.sizeof(ctypes.c_int) == 4  # C enums are passed as int


def test_every_declared_function_is_in_the_headers() -> None:
    text = "".join(_strip((header_dir() / h).read_text()) for h in ("dnnl.h", "dnnl_common.h"))
    for name in _lib.PROTOTYPE_NAMES:
        if name.startswith("omp_"):
            continue  # libgomp, see threads.py
        assert re.search(rf"\b{name}\s*\(", text), name


def test_argument_counts_match_headers() -> None:
    """Each prototype's argtypes has as many entries as the header's parameter list."""
    text = re.sub(r"\s+", " ", "".join(
        _strip((header_dir() / h).read_text()) for h in ("dnnl.h", "dnnl_common.h")))
    for name in _lib.PROTOTYPE_NAMES:
        if name.startswith("omp_"):
            continue
        params = re.search(rf"\b{name}\s*\(([^)]*)\)\s*;", text)
        assert params, name
        declared = params.group(1).strip()
        count = 0 if declared in ("", "void") else declared.count(",") + 1
        assert len(getattr(_lib.C, name).argtypes) == count, name


def test_resampling_matches_headers() -> None:
    """The resampling additions by name (the sweeps above check every member too): algorithm
    kinds, the factors query, and the prototype's parameter types one by one."""
    algs, queries = c_enums()["dnnl_alg_kind_t"], c_enums()["dnnl_query_t"]
    assert Alg.resampling_nearest == algs["dnnl_resampling_nearest"]
    assert Alg.resampling_linear == algs["dnnl_resampling_linear"]
    assert Query.factors == queries["dnnl_query_factors"]
    assert PrimitiveKind.resampling == c_enums()["dnnl_primitive_kind_t"]["dnnl_resampling"]
    text = re.sub(r"\s+", " ", _strip((header_dir() / "dnnl.h").read_text()))
    name = "dnnl_resampling_forward_primitive_desc_create"
    params = re.search(rf"\b{name}\s*\(([^)]*)\)\s*;", text)
    assert params, name
    c_types = [re.sub(r"\w+$", "", p.strip()).replace(" ", "") for p in params.group(1).split(",")]
    assert c_types == ["dnnl_primitive_desc_t*", "dnnl_engine_t", "dnnl_prop_kind_t",
                       "dnnl_alg_kind_t", "constfloat*", "const_dnnl_memory_desc_t",
                       "const_dnnl_memory_desc_t", "const_dnnl_primitive_attr_t"]
    argtypes = getattr(_lib.C, name).argtypes
    assert argtypes[4] is ctypes.POINTER(ctypes.c_float)
    assert argtypes[2] is argtypes[3] is ctypes.c_int  # enums


# C parameter type (as spelled in dnnl.h, spaces removed) -> the ctypes type it must be
_CTYPES = {"dnnl_primitive_desc_t*": _lib.HandlePtr, "dnnl_engine_t": ctypes.c_void_p,
           "const_dnnl_memory_desc_t": ctypes.c_void_p,
           "const_dnnl_primitive_attr_t": ctypes.c_void_p, "dnnl_prop_kind_t": ctypes.c_int,
           "dnnl_alg_kind_t": ctypes.c_int, "float": ctypes.c_float,
           "dnnl_dim_t": ctypes.c_int64}


@pytest.mark.parametrize("name", ["dnnl_reduction_primitive_desc_create",
                                  "dnnl_lrn_forward_primitive_desc_create"])
def test_reduction_and_lrn_prototypes_match_headers(name: str) -> None:
    """Parameter by parameter (a float passed where the header has a dnnl_dim_t, or one
    parameter too few, would be read as garbage or segfault), and the algorithm kinds."""
    text = re.sub(r"\s+", " ", _strip((header_dir() / "dnnl.h").read_text()))
    params = re.search(rf"\b{name}\s*\(([^)]*)\)\s*;", text)
    assert params, name
    c_types = [re.sub(r"\w+$", "", p.strip()).replace(" ", "") for p in params.group(1).split(",")]
    assert list(getattr(_lib.C, name).argtypes) == [_CTYPES[t] for t in c_types], c_types
    algs = c_enums()["dnnl_alg_kind_t"]
    kinds = c_enums()["dnnl_primitive_kind_t"]
    assert PrimitiveKind.reduction == kinds["dnnl_reduction"]
    assert PrimitiveKind.lrn == kinds["dnnl_lrn"]
    for member in Alg:
        if member.name.startswith(("reduction_", "lrn_")):
            assert member == algs[f"dnnl_{member.name}"], member
