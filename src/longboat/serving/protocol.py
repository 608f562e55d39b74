"""The openpi wire format: msgpack with numpy arrays and scalars as maps (FORMATS.md §3), never a pickle.

An array travels as ``{b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str, b"shape": shape}`` and a
numpy scalar as ``{b"__npgeneric__": True, b"data": value, b"dtype": dtype.str}``; the bytes equal what
``openpi_client.msgpack_numpy`` writes, so either side reads the other. Decoding checks what a message claims
(dtype kind, shape, byte count) before building anything: object, void and complex dtypes are refused both ways.
Decoded arrays are read-only views of the message buffer.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from longboat.errors import LongboatError

HEALTH_PATH = "/healthz"  # GET answers 200 while the server runs
PROMPT_KEY = "prompt"  # openpi clients send the task instruction under this key
SEED_KEY = "seed"  # optional in a request; always in the reply, so a run can be replayed

# bool, signed and unsigned integers, floats, fixed-width bytes and text: nothing that can hold a pointer
_SAFE_KINDS = frozenset("biufSU")
MAX_DIMS = 32


class ProtocolError(LongboatError, ValueError):
    """A message that is not valid msgpack-numpy, or holds something longboat refuses to decode."""


def _encode_numpy(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)):
        if obj.dtype.kind not in _SAFE_KINDS:
            raise ProtocolError(f"cannot send numpy dtype {obj.dtype} (only bool, integer, float, bytes and str)")
        if isinstance(obj, np.ndarray):
            return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def _dtype(value: Any) -> np.dtype:
    if not isinstance(value, str):
        raise ProtocolError(f"dtype must be a string, got {type(value).__name__}")
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise ProtocolError(f"unknown dtype {value!r}") from None
    if dtype.kind not in _SAFE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ProtocolError(f"refused dtype {value!r} (only bool, integer, float, bytes and str)")
    return dtype


def _decode_numpy(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        dtype, data, shape = _dtype(obj.get(b"dtype")), obj.get(b"data"), obj.get(b"shape")
        if not isinstance(data, bytes):
            raise ProtocolError("an array's data must be bytes")
        if (not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise ProtocolError(f"an array's shape must be a list of at most {MAX_DIMS} sizes, got {shape!r}")
        if math.prod(shape) * dtype.itemsize != len(data):
            raise ProtocolError(f"an array of shape {list(shape)} and dtype {dtype.str} needs "
                                f"{math.prod(shape) * dtype.itemsize} bytes, got {len(data)}")
        return np.ndarray(buffer=data, dtype=dtype, shape=shape)
    if b"__npgeneric__" in obj:
        dtype, value = _dtype(obj.get(b"dtype")), obj.get(b"data")
        if not isinstance(value, (bool, int, float, str, bytes)):
            raise ProtocolError(f"a numpy scalar's data must be a plain value, got {type(value).__name__}")
        try:
            return dtype.type(value)
        except (TypeError, ValueError, OverflowError) as e:
            raise ProtocolError(f"cannot make a {dtype.str} scalar of {value!r} ({e})") from None
    return obj


def packb(obj: Any) -> bytes:
    """One message: nested dicts, lists, plain values and numpy arrays/scalars."""
    return msgpack.packb(obj, default=_encode_numpy)


class Packer:
    """A reusable encoder (cheaper than ``packb`` for many messages)."""

    def __init__(self):
        self._packer = msgpack.Packer(default=_encode_numpy)

    def pack(self, obj: Any) -> bytes:
        return self._packer.pack(obj)


def unpackb(data: bytes) -> Any:
    """Decode one message; anything malformed or refused raises ``ProtocolError``. Limit the message's size
    before it gets here (the server's ``max_message_bytes``): decoding takes time and memory in proportion to it."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"expected a binary message, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, object_hook=_decode_numpy)
    except ProtocolError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as e:  # ExtraData, FormatError, StackError, bad keys
        raise ProtocolError(f"not a msgpack message ({type(e).__name__}: {e})") from None
