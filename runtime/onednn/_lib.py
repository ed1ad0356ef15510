"""Loading libdnnl.so.3 and declaring the C prototypes the binding uses.

This is the only module of qfuse that talks to ctypes directly (memory.py, attr.py and
primitive.py build ctypes values through the names exported here).

Safety rules, enforced here:

- Every C function the binding calls is declared in `_PROTOTYPES` with its `restype` and
  `argtypes`; `C` exposes *only* those, so a call to an undeclared function is an AttributeError,
  never a call with guessed (int-truncated) arguments. One twin: `execute_preconverted`, the
  run loop's `dnnl_primitive_execute` without `argtypes`, which its one caller
  (`BoundPrimitive.call`) gives ctypes objects of exactly the declared types, built once per
  bound primitive and checked against the declaration (`preconverted`): ctypes passes them
  as they are instead of converting four arguments on every call, 0.28 µs less per kernel
  (1.30 against 1.58 µs for a 1-element reorder at two threads, this 2-core AMD EPYC).
- Enums are `c_int`; `dnnl_dims_t` is `Dims` (`c_int64 * 12`): ctypes refuses anything else in
  that position, so a short dims array can never be read past its end.
- Every returned `dnnl_status_t` goes through `check`, which raises `DnnlError`.
- Every created handle is owned by one Python object (`Native`) and destroyed exactly once, by
  a `weakref.finalize` when that object is collected: not in `__del__` (which may run during
  interpreter shutdown after module globals are gone, or twice on resurrection), and not at
  exit (finalizers are marked `atexit=False`; the process is ending). An object that a live
  handle depends on is referenced by its user (a Primitive holds its PrimitiveDesc, a bound
  primitive its Memory objects, a Memory its Engine and buffer), so it is never destroyed first.

The library is located through the installed files of the `onednn-cpu-gomp` distribution (no
hard-coded paths). Environment variables read by oneDNN at load time (`ONEDNN_MAX_CPU_ISA`,
`ONEDNN_VERBOSE`, `OMP_NUM_THREADS`) must therefore be set before this module is imported.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint,
    c_void_p,
)
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from qfuse.runtime.onednn.enums import Status

log = logging.getLogger(__name__)

DISTRIBUTION = "onednn-cpu-gomp"
LIBRARY_NAME = "libdnnl.so.3"
MAX_NDIMS = 12

Dims = c_int64 * MAX_NDIMS  # dnnl_dims_t: always a full 12-element array
Handle = c_void_p  # every opaque dnnl_*_t handle
HandlePtr = POINTER(c_void_p)
DimsPtr = POINTER(c_int64)


class ExecArg(Structure):
    """dnnl_exec_arg_t: {int arg; dnnl_memory_t memory;} (16 bytes on x86-64)."""

    _fields_ = [("arg", c_int), ("memory", c_void_p)]


class VersionStruct(Structure):
    """dnnl_version_t."""

    _fields_ = [
        ("major", c_int),
        ("minor", c_int),
        ("patch", c_int),
        ("hash", c_char_p),
        ("cpu_runtime", c_uint),
        ("gpu_runtime", c_uint),
    ]


class OneDnnNotInstalledError(ImportError):
    """libdnnl.so.3 could not be found through the installed Python distribution."""


class DnnlError(RuntimeError):
    """A oneDNN C call returned a status other than dnnl_success."""

    def __init__(self, call: str, status: int, detail: str = "") -> None:
        try:
            self.status: Status | int = Status(status)
            status_name = self.status.name
        except ValueError:
            self.status = status
            status_name = f"unknown status {status}"
        self.call = call
        self.status_name = status_name
        self.detail = detail
        message = f"{call} failed with dnnl_{status_name} ({status})"
        if detail:
            message += f": {detail}"
        super().__init__(message)


_live: Counter[str] = Counter()  # handles created and not yet destroyed, by owner class
_live_lock = threading.Lock()


def live_handles() -> dict[str, int]:
    """How many handles of each owner class exist now (for leak tests and debugging)."""
    with _live_lock:
        return {kind: count for kind, count in _live.items() if count}


def _destroy(destroy: Callable[[c_void_p], Any], handle: c_void_p, kind: str) -> None:
    destroy(handle)
    with _live_lock:
        _live[kind] -= 1


class Native:
    """Owner of one oneDNN handle (``self.handle``), destroyed when the owner is collected."""

    handle: c_void_p

    def _own(self, handle: c_void_p, destroy: Callable[[c_void_p], Any]) -> None:
        """Take ``handle``; ``destroy(handle)`` runs once, when this object goes."""
        self.handle = handle
        kind = type(self).__name__
        with _live_lock:
            _live[kind] += 1
        finalizer = weakref.finalize(self, _destroy, destroy, handle, kind)
        finalizer.atexit = False


def check(status: int, call: str, detail: str = "") -> None:
    """Raise DnnlError unless `status` is dnnl_success."""
    if status != Status.success:
        raise DnnlError(call, status, detail)


def dims(values: tuple[int, ...] | list[int] | None = None) -> Any:
    """A full 12-element dnnl_dims_t holding `values` (zero-filled after them)."""
    values = tuple(values or ())
    if len(values) > MAX_NDIMS:
        raise ValueError(f"at most {MAX_NDIMS} dimensions are supported, got {len(values)}")
    return Dims(*(int(v) for v in values))


def find_library() -> Path:
    """Path of libdnnl.so.3 from the files recorded for the onednn-cpu-gomp distribution."""
    try:
        files = importlib.metadata.files(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise OneDnnNotInstalledError(
            f"the Python package {DISTRIBUTION!r} is not installed; "
            f"install it with `pip install {DISTRIBUTION}==2023.2.0` (or `make test`)"
        ) from exc
    for entry in files or ():
        if entry.name == LIBRARY_NAME:
            path = Path(str(entry.locate())).resolve()
            if path.is_file():
                return path
    raise OneDnnNotInstalledError(
        f"{DISTRIBUTION} is installed but {LIBRARY_NAME} is not among its files; "
        f"reinstall it with `pip install --force-reinstall {DISTRIBUTION}==2023.2.0`"
    )


_S = c_int  # dnnl_status_t
_E = c_int  # any enum
# name -> (restype, argtypes). Signatures copied from include/oneapi/dnnl/dnnl.h (3.2).
_PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    # global / version / isa
    "dnnl_version": (POINTER(VersionStruct), []),
    "dnnl_set_verbose": (_S, [c_int]),
    "dnnl_set_max_cpu_isa": (_S, [_E]),
    "dnnl_get_effective_cpu_isa": (_E, []),
    "dnnl_set_primitive_cache_capacity": (_S, [c_int]),
    "dnnl_get_primitive_cache_capacity": (_S, [POINTER(c_int)]),
    # engine / stream
    "dnnl_engine_get_count": (c_size_t, [_E]),
    "dnnl_engine_create": (_S, [HandlePtr, _E, c_size_t]),
    "dnnl_engine_destroy": (_S, [Handle]),
    "dnnl_stream_create": (_S, [HandlePtr, Handle, c_uint]),
    "dnnl_stream_wait": (_S, [Handle]),
    "dnnl_stream_destroy": (_S, [Handle]),
    # memory descriptors
    "dnnl_memory_desc_create_with_tag": (_S, [HandlePtr, c_int, Dims, _E, _E]),
    "dnnl_memory_desc_create_with_strides": (_S, [HandlePtr, c_int, Dims, _E, Dims]),
    "dnnl_memory_desc_clone": (_S, [HandlePtr, Handle]),
    "dnnl_memory_desc_destroy": (_S, [Handle]),
    "dnnl_memory_desc_query": (_S, [Handle, _E, c_void_p]),
    "dnnl_memory_desc_equal": (c_int, [Handle, Handle]),
    "dnnl_memory_desc_get_size": (c_size_t, [Handle]),
    "dnnl_data_type_size": (c_size_t, [_E]),
    # memory
    "dnnl_memory_create": (_S, [HandlePtr, Handle, Handle, c_void_p]),
    "dnnl_memory_get_data_handle": (_S, [Handle, HandlePtr]),
    "dnnl_memory_destroy": (_S, [Handle]),
    # attributes and post-ops
    "dnnl_primitive_attr_create": (_S, [HandlePtr]),
    "dnnl_primitive_attr_destroy": (_S, [Handle]),
    "dnnl_primitive_attr_set_scratchpad_mode": (_S, [Handle, _E]),
    "dnnl_primitive_attr_set_fpmath_mode": (_S, [Handle, _E]),
    "dnnl_primitive_attr_set_scales_mask": (_S, [Handle, c_int, c_int]),
    "dnnl_primitive_attr_set_zero_points_mask": (_S, [Handle, c_int, c_int]),
    "dnnl_primitive_attr_set_post_ops": (_S, [Handle, Handle]),
    "dnnl_post_ops_create": (_S, [HandlePtr]),
    "dnnl_post_ops_destroy": (_S, [Handle]),
    "dnnl_post_ops_len": (c_int, [Handle]),
    "dnnl_post_ops_get_kind": (_E, [Handle, c_int]),
    "dnnl_post_ops_append_eltwise": (_S, [Handle, _E, c_float, c_float]),
    "dnnl_post_ops_append_sum": (_S, [Handle, c_float, c_int32, _E]),
    "dnnl_post_ops_append_binary": (_S, [Handle, _E, Handle]),
    "dnnl_post_ops_append_prelu": (_S, [Handle, c_int]),
    # primitive descriptors
    "dnnl_primitive_desc_destroy": (_S, [Handle]),
    "dnnl_primitive_desc_query": (_S, [Handle, _E, c_int, c_void_p]),
    "dnnl_primitive_desc_query_md": (Handle, [Handle, _E, c_int]),
    "dnnl_primitive_desc_query_s32": (c_int, [Handle, _E, c_int]),
    "dnnl_primitive_desc_next_impl": (_S, [Handle]),
    "dnnl_convolution_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, Handle, Handle, Handle, Handle, Dims, Dims, Dims, Dims, Handle],
    ),
    "dnnl_deconvolution_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, Handle, Handle, Handle, Handle, Dims, Dims, Dims, Dims, Handle],
    ),
    "dnnl_inner_product_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, Handle, Handle, Handle, Handle, Handle],
    ),
    "dnnl_matmul_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, Handle, Handle, Handle, Handle, Handle],
    ),
    "dnnl_pooling_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, Handle, Handle, Dims, Dims, Dims, Dims, Dims, Handle],
    ),
    "dnnl_eltwise_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, Handle, Handle, c_float, c_float, Handle],
    ),
    "dnnl_binary_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, Handle, Handle, Handle, Handle],
    ),
    "dnnl_reorder_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, Handle, Handle, Handle, Handle],
    ),
    "dnnl_concat_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, Handle, c_int, c_int, HandlePtr, Handle],
    ),
    "dnnl_resampling_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, POINTER(c_float), Handle, Handle, Handle],
    ),
    "dnnl_softmax_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, Handle, Handle, c_int, Handle],
    ),
    "dnnl_reduction_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, Handle, Handle, c_float, c_float, Handle],
    ),
    "dnnl_lrn_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, Handle, Handle, c_int64, c_float, c_float, c_float, Handle],
    ),
    "dnnl_layer_normalization_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, Handle, Handle, Handle, c_float, c_uint, Handle],
    ),
    # recurrent cells (oneDNN 3.2 dnnl.h, "RNN"): descriptors in the C order, flags unsigned
    "dnnl_vanilla_rnn_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, _E, Handle, Handle, Handle, Handle, Handle, Handle, Handle,
         c_uint, c_float, c_float, Handle],
    ),
    "dnnl_lstm_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, Handle, Handle, Handle, Handle, Handle, Handle, Handle,
         Handle, Handle, Handle, Handle, c_uint, Handle],
    ),
    "dnnl_gru_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, Handle, Handle, Handle, Handle, Handle, Handle, Handle,
         c_uint, Handle],
    ),
    "dnnl_lbr_gru_forward_primitive_desc_create": (
        _S,
        [HandlePtr, Handle, _E, _E, Handle, Handle, Handle, Handle, Handle, Handle, Handle,
         c_uint, Handle],
    ),
    # primitives
    "dnnl_primitive_create": (_S, [HandlePtr, Handle]),
    "dnnl_primitive_execute": (_S, [Handle, Handle, c_int, POINTER(ExecArg)]),
    "dnnl_primitive_destroy": (_S, [Handle]),
    # OpenMP runtime of libdnnl (see threads.py): resolved through libdnnl's own dependency
    # list, so these are the libgomp.so.1 functions oneDNN itself calls.
    "omp_set_num_threads": (None, [c_int]),
    "omp_get_max_threads": (c_int, []),
}


def _load() -> tuple[ctypes.CDLL, Path]:
    path = find_library()
    try:
        cdll = ctypes.CDLL(str(path))
    except OSError as exc:
        raise OneDnnNotInstalledError(f"cannot load {path}: {exc}") from exc
    log.debug("loaded %s", path)
    return cdll, path


_CDLL, LIBRARY_PATH = _load()


def _declare(cdll: ctypes.CDLL) -> SimpleNamespace:
    namespace = SimpleNamespace()
    for name, (restype, argtypes) in _PROTOTYPES.items():
        function = getattr(cdll, name)
        function.restype = restype
        function.argtypes = argtypes
        setattr(namespace, name, function)
    return namespace


#: The declared C functions, and only those.
C = _declare(_CDLL)
PROTOTYPE_NAMES = frozenset(_PROTOTYPES)

#: dnnl_primitive_execute without argtypes (module docstring): call it only with `preconverted`
execute_preconverted = _CDLL["dnnl_primitive_execute"]  # [] makes a new function object
execute_preconverted.restype = _PROTOTYPES["dnnl_primitive_execute"][0]


def preconverted(*values: Any) -> tuple[Any, ...]:
    """``values`` for `execute_preconverted`, each checked to be an instance of its declared
    argument type of dnnl_primitive_execute (a TypeError otherwise)."""
    declared = _PROTOTYPES["dnnl_primitive_execute"][1]
    if len(values) != len(declared):
        raise TypeError(f"dnnl_primitive_execute takes {len(declared)} arguments, "
                        f"got {len(values)}")
    for index, (value, kind) in enumerate(zip(values, declared, strict=True)):
        ok = isinstance(value, kind) or (issubclass(kind, ctypes._Pointer)  # an array of T
                                         and isinstance(value, ctypes.Array)
                                         and value._type_ is kind._type_)
        if not ok:
            raise TypeError(f"dnnl_primitive_execute argument {index}: {type(value).__name__}, "
                            f"declared {kind.__name__}")
    return values
