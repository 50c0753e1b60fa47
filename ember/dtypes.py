"""Element types of tensors, and their NumPy counterparts."""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

from ember.errors import EmberError


class DType(enum.Enum):
    """A tensor element type. The value is the name used in the IR text (`f32[4,8]`)."""

    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"
    f64 = "f64"
    i8 = "i8"
    i16 = "i16"
    i32 = "i32"
    i64 = "i64"
    u8 = "u8"
    u16 = "u16"
    u32 = "u32"
    u64 = "u64"
    bool = "bool"

    def __repr__(self) -> str:
        return f"DType.{self.value}"

    def __str__(self) -> str:
        return self.value

    @property
    def np(self) -> np.dtype:
        """The NumPy dtype that stores values of this type."""
        return _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        return self.np.itemsize

    @property
    def is_float(self) -> bool:
        return self in FLOAT_TYPES

    @property
    def is_int(self) -> bool:
        return self in INT_TYPES

    @property
    def is_signed(self) -> bool:
        return self in SIGNED_INT_TYPES or self.is_float

    @property
    def is_bool(self) -> bool:
        return self is DType.bool

    @property
    def compute(self) -> DType:
        """The type arithmetic runs in: half-precision floats compute in f32 and round back."""
        return DType.f32 if self in (DType.f16, DType.bf16) else self


FLOAT_TYPES = frozenset({DType.f16, DType.bf16, DType.f32, DType.f64})
SIGNED_INT_TYPES = frozenset({DType.i8, DType.i16, DType.i32, DType.i64})
UNSIGNED_INT_TYPES = frozenset({DType.u8, DType.u16, DType.u32, DType.u64})
INT_TYPES = SIGNED_INT_TYPES | UNSIGNED_INT_TYPES
NUMERIC_TYPES = FLOAT_TYPES | INT_TYPES
ALL_TYPES = frozenset(DType)

_TO_NUMPY: dict[DType, np.dtype] = {
    DType.f16: np.dtype(np.float16),
    DType.bf16: np.dtype(ml_dtypes.bfloat16),
    DType.f32: np.dtype(np.float32),
    DType.f64: np.dtype(np.float64),
    DType.i8: np.dtype(np.int8),
    DType.i16: np.dtype(np.int16),
    DType.i32: np.dtype(np.int32),
    DType.i64: np.dtype(np.int64),
    DType.u8: np.dtype(np.uint8),
    DType.u16: np.dtype(np.uint16),
    DType.u32: np.dtype(np.uint32),
    DType.u64: np.dtype(np.uint64),
    DType.bool: np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}


def from_numpy(dtype: np.dtype | type) -> DType:
    """The DType of a NumPy dtype; raises EmberError for types Ember does not have."""
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise EmberError(f"unsupported element type {dtype!r}") from None


def parse_dtype(name: str) -> DType:
    try:
        return DType(name)
    except ValueError:
        raise EmberError(f"unknown dtype '{name}'") from None
