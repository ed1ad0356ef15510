"""ctypes binding of the oneDNN 3.2 C API (libdnnl.so.3 from onednn-cpu-gomp==2023.2.0).

The only package of qfuse that imports ctypes. Typical use:

    src = MemoryDesc.from_tag((1, 16, 8, 8), DataType.u8, FormatTag.nhwc)
    ...
    attr = PrimitiveAttr().set_scales_mask(Arg.WEIGHTS, 1).set_post_ops(post_ops)
    pd = convolution(src, wei_any, dst, bias=bias, padding_l=(1, 1), padding_r=(1, 1),
                     attr=attr)
    conv = pd.create()            # JIT happens here
    conv.execute({Arg.SRC: ..., Arg.WEIGHTS: ..., Arg.scales(Arg.WEIGHTS): ..., ...})

Importing this package loads the library: set ONEDNN_MAX_CPU_ISA / ONEDNN_VERBOSE /
OMP_NUM_THREADS before the import if you need them.
"""

from __future__ import annotations

from qfuse.runtime.onednn._lib import LIBRARY_PATH, DnnlError, OneDnnNotInstalledError, check
from qfuse.runtime.onednn.attr import AttrInfo, PostOpRecord, PostOps, PrimitiveAttr
from qfuse.runtime.onednn.enums import (
    BINARY_ALGS,
    ELTWISE_ALGS,
    LRN_ALGS,
    POOLING_ALGS,
    REDUCTION_ALGS,
    RESAMPLING_ALGS,
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
    Status,
    arg_name,
)
from qfuse.runtime.onednn.memory import (
    Engine,
    Memory,
    MemoryDesc,
    Stream,
    data_type_of,
    default_engine,
    default_stream,
)
from qfuse.runtime.onednn.primitive import BoundPrimitive, ExpectedArg, Primitive, PrimitiveDesc
from qfuse.runtime.onednn.primitives import (
    binary,
    concat,
    convolution,
    deconvolution,
    eltwise,
    filled,
    inner_product,
    layer_normalization,
    lrn,
    matmul,
    pooling,
    reduction,
    reorder,
    resampling,
    softmax,
)
from qfuse.runtime.onednn.threads import (
    Version,
    effective_cpu_isa,
    get_num_threads,
    set_max_cpu_isa,
    set_num_threads,
    set_verbose,
    version,
)

__all__ = [
    "BINARY_ALGS", "ELTWISE_ALGS", "LIBRARY_PATH", "LRN_ALGS", "POOLING_ALGS",
    "REDUCTION_ALGS", "RESAMPLING_ALGS",
    "Alg", "Arg", "AttrInfo",
    "BoundPrimitive", "CpuIsa", "DataType", "DnnlError", "Engine", "EngineKind", "ExpectedArg",
    "FormatKind", "FormatTag", "FpMathMode", "Memory", "MemoryDesc", "NormFlags",
    "OneDnnNotInstalledError", "PostOpRecord", "PostOps", "Primitive", "PrimitiveAttr",
    "PrimitiveDesc", "PrimitiveKind", "PropKind", "Query", "Status", "Stream", "Version",
    "arg_name", "binary", "check", "concat", "convolution", "data_type_of", "deconvolution",
    "default_engine", "default_stream", "effective_cpu_isa", "eltwise", "filled", "get_num_threads",
    "inner_product", "layer_normalization", "lrn", "matmul", "pooling", "reduction", "reorder",
    "resampling",
    "set_max_cpu_isa",
    "set_num_threads", "set_verbose", "softmax", "version",
]
