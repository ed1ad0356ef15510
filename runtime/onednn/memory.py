"""Engines, streams, memory descriptors and memory objects.

Ownership rules (the C API leaves them to the caller):

- Every object here owns its handle, destroyed once when the object goes (_lib.Native).
  Descriptors returned by primitive-descriptor queries belong to the primitive descriptor, so
  `MemoryDesc.clone_of` copies them with dnnl_memory_desc_clone: the copy outlives it.
- A `Memory` keeps a reference to the numpy buffer its data handle points into, so the buffer
  lives as long as the dnnl memory even when the caller drops its own reference.
- The engine is created once per process (`default_engine()`); every Memory and primitive
  keeps a reference to the Engine it was made on. `default_stream()` is one per thread.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from ctypes import POINTER, byref, c_int, c_int64, c_void_p
from typing import Any

import numpy as np

from qfuse.runtime.onednn import _lib
from qfuse.runtime.onednn._lib import MAX_NDIMS, C, Native, check
from qfuse.runtime.onednn.enums import (
    DataType,
    EngineKind,
    FormatKind,
    FormatTag,
    Query,
    StreamFlags,
)

log = logging.getLogger(__name__)

ALIGNMENT = 64  # bytes; what oneDNN itself uses for buffers it allocates
MAX_BYTES = 1 << 40  # one tensor; far above any real model, far below size_t wrap-around

NUMPY_DTYPES: dict[DataType, np.dtype[Any]] = {
    DataType.f16: np.dtype(np.float16),
    DataType.f32: np.dtype(np.float32),
    DataType.s32: np.dtype(np.int32),
    DataType.s8: np.dtype(np.int8),
    DataType.u8: np.dtype(np.uint8),
    DataType.f64: np.dtype(np.float64),
    DataType.boolean: np.dtype(np.bool_),
}


def data_type_of(dtype: np.dtype[Any] | type) -> DataType:
    """The oneDNN data type of a numpy dtype (ValueError for dtypes oneDNN lacks)."""
    dtype = np.dtype(dtype)
    for data_type, candidate in NUMPY_DTYPES.items():
        if candidate == dtype:
            return data_type
    raise ValueError(f"numpy dtype {dtype} has no oneDNN data type")


class Engine(Native):
    """A oneDNN engine (CPU only in qfuse)."""

    def __init__(self, kind: EngineKind = EngineKind.cpu, index: int = 0) -> None:
        self.kind = kind
        self.index = index
        count = C.dnnl_engine_get_count(kind)
        if index >= count:
            raise ValueError(f"{kind.name} engine index {index} out of range ({count} engines)")
        handle = c_void_p()
        check(C.dnnl_engine_create(byref(handle), kind, index), "dnnl_engine_create",
              f"{kind.name} engine {index}")
        self._own(handle, C.dnnl_engine_destroy)


    def __repr__(self) -> str:
        return f"Engine({self.kind.name}, {self.index})"


@functools.cache
def default_engine() -> Engine:
    """The process-wide CPU engine (index 0)."""
    return Engine(EngineKind.cpu, 0)


class Stream(Native):
    """An in-order oneDNN stream on an engine."""

    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine or default_engine()
        handle = c_void_p()
        check(C.dnnl_stream_create(byref(handle), self.engine.handle, StreamFlags.in_order),
              "dnnl_stream_create", repr(self.engine))
        self._own(handle, C.dnnl_stream_destroy)

    def wait(self) -> None:
        check(C.dnnl_stream_wait(self.handle), "dnnl_stream_wait")



_per_thread = threading.local()


def default_stream() -> Stream:
    """The calling thread's in-order stream on the default engine (a stream is used by one
    thread at a time, so threads compiling or executing at once get one each)."""
    stream = getattr(_per_thread, "stream", None)
    if stream is None:
        stream = _per_thread.stream = Stream(default_engine())
    return stream


class MemoryDesc(Native):
    """An owned dnnl_memory_desc_t. Build with `from_tag`, `from_strides` or `clone_of`."""

    def __init__(self, handle: c_void_p) -> None:
        """Take ownership of `handle` (use the class methods instead of calling this)."""
        self._own(handle, C.dnnl_memory_desc_destroy)

    @classmethod
    def from_tag(cls, dims: tuple[int, ...] | list[int], dtype: DataType,
                 tag: FormatTag | None = None) -> MemoryDesc:
        """Descriptor of `dims` and `dtype` in layout `tag` (default: dense row-major)."""
        dims = tuple(int(d) for d in dims)
        if tag is None:  # dense row-major at any rank (FormatTag lists plain tags to 6-D)
            strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
            return cls.from_strides(dims, dtype, strides)
        _check_dims(dims, dtype)
        handle = c_void_p()
        check(C.dnnl_memory_desc_create_with_tag(byref(handle), len(dims), _lib.dims(dims),
                                                 DataType(dtype), FormatTag(tag)),
              "dnnl_memory_desc_create_with_tag",
              f"dims={dims} dtype={DataType(dtype).name} tag={FormatTag(tag).name}")
        return cls(handle)

    @classmethod
    def from_strides(cls, dims: tuple[int, ...] | list[int], dtype: DataType,
                     strides: tuple[int, ...] | list[int]) -> MemoryDesc:
        """Descriptor of `dims` and `dtype` with element `strides` (not bytes)."""
        dims = tuple(int(d) for d in dims)
        strides = tuple(int(s) for s in strides)
        _check_dims(dims, dtype)
        if len(strides) != len(dims) or any(st < 0 for st in strides):
            raise ValueError(f"strides {strides} do not fit dims {dims}")
        span = 1 + sum((d - 1) * st for d, st in zip(dims, strides, strict=True))
        _check_dims((span,), dtype)
        handle = c_void_p()
        check(C.dnnl_memory_desc_create_with_strides(byref(handle), len(dims), _lib.dims(dims),
                                                     DataType(dtype), _lib.dims(strides)),
              "dnnl_memory_desc_create_with_strides",
              f"dims={dims} dtype={DataType(dtype).name} strides={strides}")
        return cls(handle)

    @classmethod
    def clone_of(cls, handle: int | c_void_p | None) -> MemoryDesc | None:
        """Own a copy of a descriptor we do not own; None for NULL or the zero descriptor."""
        if not handle:
            return None
        source = c_void_p(handle) if isinstance(handle, int) else handle
        ndims = c_int()
        check(C.dnnl_memory_desc_query(source, Query.ndims_s32, byref(ndims)),
              "dnnl_memory_desc_query", "ndims")
        if ndims.value == 0:
            return None
        copy = c_void_p()
        check(C.dnnl_memory_desc_clone(byref(copy), source), "dnnl_memory_desc_clone")
        return cls(copy)

    @classmethod
    def for_array(cls, array: np.ndarray) -> MemoryDesc:
        """Plain descriptor with the shape, dtype and (element) strides of `array`."""
        itemsize = array.dtype.itemsize
        if any(s % itemsize for s in array.strides) or any(s < 0 for s in array.strides):
            raise ValueError(f"array strides {array.strides} are not non-negative element steps")
        return cls.from_strides(array.shape, data_type_of(array.dtype),
                                tuple(s // itemsize for s in array.strides))


    # -- queries -------------------------------------------------------------------------------
    def _query_int(self, what: Query) -> int:
        value = c_int()
        check(C.dnnl_memory_desc_query(self.handle, what, byref(value)),
              "dnnl_memory_desc_query", what.name)
        return value.value

    def _query_dims(self, what: Query, count: int) -> tuple[int, ...]:
        pointer = POINTER(c_int64)()
        check(C.dnnl_memory_desc_query(self.handle, what, byref(pointer)),
              "dnnl_memory_desc_query", what.name)
        return tuple(int(pointer[i]) for i in range(count))

    @functools.cached_property
    def ndims(self) -> int:
        return self._query_int(Query.ndims_s32)

    @functools.cached_property
    def dims(self) -> tuple[int, ...]:
        return self._query_dims(Query.dims, self.ndims)

    @functools.cached_property
    def dtype(self) -> DataType:
        return DataType(self._query_int(Query.data_type))

    @functools.cached_property
    def format_kind(self) -> FormatKind:
        return FormatKind(self._query_int(Query.format_kind))

    @functools.cached_property
    def size(self) -> int:
        """Bytes a memory of this descriptor needs (includes padding and compensation)."""
        return int(C.dnnl_memory_desc_get_size(self.handle))

    @property
    def strides(self) -> tuple[int, ...] | None:
        """Element strides of the outermost blocks; None unless the format is blocked."""
        if self.format_kind != FormatKind.blocked:
            return None
        return self._query_dims(Query.strides, self.ndims)

    @property
    def inner_blocks(self) -> tuple[tuple[int, int], ...]:
        """(logical dim, block size) pairs of the inner blocks, outermost first."""
        if self.format_kind != FormatKind.blocked:
            return ()
        count = self._query_int(Query.inner_nblks_s32)
        if count == 0:
            return ()
        sizes = self._query_dims(Query.inner_blks, count)
        indices = self._query_dims(Query.inner_idxs, count)
        return tuple(zip(indices, sizes, strict=True))

    @functools.cached_property
    def is_plain(self) -> bool:
        """Blocked without inner blocks, without padding or offset: numpy can view it."""
        if self.format_kind != FormatKind.blocked or self.inner_blocks:
            return False
        padded = self._query_dims(Query.padded_dims, self.ndims)
        offset = c_int64()
        check(C.dnnl_memory_desc_query(self.handle, Query.submemory_offset_s64, byref(offset)),
              "dnnl_memory_desc_query", "submemory_offset_s64")
        return padded == self.dims and offset.value == 0

    def size1_strides_of(self, other: MemoryDesc) -> MemoryDesc:
        """This layout with the stride of every size-1 dim taken from ``other`` (of the same
        dims): no address changes (a size-1 dim has only index 0). oneDNN's descriptor
        equality, and so its primitive cache key, ignores those strides, but oneDNN 3.2's jit
        binary reads them: with src0 and src1 differing in one (a row-major (1, 2, 2100)
        beside a slice of (1, 4, 2100) whose leading stride is 8400) it computes every row
        after the first wrong, silently, and the cache then hands that kernel to later
        binaries of the same key (tests/runtime/test_onednn_f32.py). ``self`` when either is
        not plain, the dims differ, or nothing changes."""
        if not (self.is_plain and other.is_plain) or self.dims != other.dims:
            return self
        mine, theirs = self.strides or (), other.strides or ()
        strides = tuple(t if d == 1 else m for d, m, t in zip(self.dims, mine, theirs,
                                                                 strict=True))
        if strides == mine:
            return self
        return MemoryDesc.from_strides(self.dims, self.dtype, strides)

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        try:
            return NUMPY_DTYPES[self.dtype]
        except KeyError:
            raise ValueError(f"oneDNN data type {self.dtype.name} has no numpy dtype") from None

    @property
    def nelems(self) -> int:
        return math.prod(self.dims)

    def describe(self) -> str:
        """Short text such as 'u8 (1, 16, 8, 8) strides=(1024, 1, 128, 16)'."""
        text = f"{self.dtype.name} {self.dims}"
        if self.format_kind == FormatKind.blocked:
            text += f" strides={self.strides}"
            if self.inner_blocks:
                text += f" blocks={self.inner_blocks}"
        else:
            text += f" format={self.format_kind.name}"
        return text

    def __repr__(self) -> str:
        return f"MemoryDesc({self.describe()})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemoryDesc):
            return NotImplemented
        return bool(C.dnnl_memory_desc_equal(self.handle, other.handle))

    def __hash__(self) -> int:
        return hash((self.dims, self.dtype, self.format_kind, self.strides, self.inner_blocks))


def _check_dims(dims: tuple[int, ...], dtype: DataType) -> None:
    """Rank and size checks oneDNN does not do (its size computation wraps around silently)."""
    if not 0 < len(dims) <= MAX_NDIMS:
        raise ValueError(f"a memory descriptor needs 1..{MAX_NDIMS} dims, got {dims}")
    if any(d <= 0 for d in dims):
        raise ValueError(f"dims must be positive, got {dims}")
    nbytes = math.prod(dims) * int(C.dnnl_data_type_size(DataType(dtype)))
    if nbytes > MAX_BYTES:
        raise ValueError(f"dims {dims} of {DataType(dtype).name} need {nbytes} bytes, more than "
                         f"the {MAX_BYTES} bytes qfuse allows for one tensor")


def _aligned_bytes(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of `nbytes` whose data starts on an ALIGNMENT boundary."""
    raw = np.zeros(nbytes + ALIGNMENT, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + nbytes]


class Memory(Native):
    """A dnnl_memory_t over a numpy buffer that this object keeps alive.

    `Memory(md)` allocates an aligned zeroed buffer of `md.size` bytes. `Memory(md, buffer)`
    wraps `buffer` without copying: it must be a writeable C-contiguous numpy array of exactly
    `md.size` bytes whose dtype is the descriptor's (or uint8, read as raw bytes).
    """

    def __init__(self, md: MemoryDesc, buffer: np.ndarray | None = None,
                 engine: Engine | None = None) -> None:
        self.md = md
        self.engine = engine or default_engine()
        if buffer is None:
            buffer = _aligned_bytes(md.size)
        else:
            _check_buffer(md, buffer)
        self._buffer = buffer  # keeps the data alive as long as the dnnl memory
        handle = c_void_p()
        check(C.dnnl_memory_create(byref(handle), md.handle, self.engine.handle,
                                   c_void_p(buffer.ctypes.data)),
              "dnnl_memory_create", md.describe())
        self._own(handle, C.dnnl_memory_destroy)

    @classmethod
    def from_array(cls, array: np.ndarray, engine: Engine | None = None) -> Memory:
        """Wrap a C-contiguous array (no copy) with a plain descriptor of its shape."""
        if not array.flags.c_contiguous:
            raise ValueError("Memory.from_array needs a C-contiguous array "
                             "(use np.ascontiguousarray first)")
        return cls(MemoryDesc.for_array(array), array, engine)

    @classmethod
    def scales(cls, values: np.ndarray | list[float] | float) -> Memory:
        """f32 1-D memory (tag a) for an ATTR_SCALES argument."""
        return cls.from_array(np.ascontiguousarray(np.atleast_1d(values), dtype=np.float32))

    @classmethod
    def zero_points(cls, values: np.ndarray | list[int] | int) -> Memory:
        """s32 1-D memory (tag a) for an ATTR_ZERO_POINTS argument."""
        return cls.from_array(np.ascontiguousarray(np.atleast_1d(values), dtype=np.int32))


    @property
    def data_ptr(self) -> int:
        return int(self._buffer.ctypes.data)

    @property
    def array(self) -> np.ndarray:
        """A numpy view of the data (writes go to the memory); plain layouts only."""
        md = self.md
        if not md.is_plain:
            raise ValueError(f"memory {md.describe()} is not plain; reorder it to a plain "
                             "layout before viewing it from numpy")
        dtype = md.numpy_dtype
        strides = tuple(s * dtype.itemsize for s in md.strides or ())
        raw = self._buffer.reshape(-1).view(np.uint8)
        return np.ndarray(md.dims, dtype=dtype, buffer=raw, strides=strides)

    def write(self, values: np.ndarray) -> None:
        """Copy `values` in (same shape and dtype as the descriptor; no implicit casts)."""
        values = np.asarray(values)
        target = self.array
        if values.shape != target.shape or values.dtype != target.dtype:
            raise ValueError(f"cannot write {values.dtype} {values.shape} into memory "
                             f"{self.md.describe()}; convert it first")
        target[...] = values

    def read(self) -> np.ndarray:
        """A copy of the data as a C-contiguous numpy array."""
        return np.ascontiguousarray(self.array).copy()

    def __repr__(self) -> str:
        return f"Memory({self.md.describe()})"


def _check_buffer(md: MemoryDesc, buffer: np.ndarray) -> None:
    if not isinstance(buffer, np.ndarray):
        raise TypeError(f"memory buffer must be a numpy array, got {type(buffer).__name__}")
    if not buffer.flags.c_contiguous:
        raise ValueError("memory buffer must be C-contiguous (use np.ascontiguousarray)")
    if not buffer.flags.writeable:
        raise ValueError("memory buffer must be writeable")
    if buffer.nbytes != md.size:
        raise ValueError(f"memory buffer has {buffer.nbytes} bytes, descriptor "
                         f"{md.describe()} needs {md.size}")
    expected = NUMPY_DTYPES.get(md.dtype)
    if buffer.dtype != np.uint8 and buffer.dtype != expected:
        raise ValueError(f"memory buffer dtype {buffer.dtype} does not match descriptor "
                         f"{md.describe()} (expected {expected} or raw uint8)")
