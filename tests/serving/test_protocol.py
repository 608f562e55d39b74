"""The wire format against the real ``openpi_client.msgpack_numpy``: the same bytes both ways, and refusals."""

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy as openpi

from longboat.serving.protocol import Packer, ProtocolError, packb, unpackb


def _message():
    rng = np.random.default_rng(0)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(8).astype(np.float32),
        "nested": {"f64": rng.standard_normal((2, 3)), "i64": np.arange(6, dtype=np.int64).reshape(3, 2),
                   "bool": np.array([True, False]), "f16": np.ones(3, np.float16), "be": np.arange(3, dtype=">i4")},
        "strided": np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
        "empty": np.zeros((0, 5), np.float32),
        "scalars": [np.float32(1.5), np.int64(-3), np.bool_(True), np.uint8(7)],
        "prompt": "pick up the bowl",
        "seed": 12,
        "none": None,
    }


def _same(a, b):
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, np.generic):
        assert type(a) is type(b) and a == b
    else:
        assert a == b


def test_bytes_equal_openpi_both_ways():
    msg = _message()
    ours, theirs = packb(msg), openpi.packb(msg)
    assert ours == theirs
    assert Packer().pack(msg) == openpi.Packer().pack(msg)
    _same(msg, unpackb(theirs))
    _same(msg, openpi.unpackb(ours))


def test_decoded_arrays_are_read_only_views():
    image = unpackb(openpi.packb({"x": np.arange(4, dtype=np.float32)}))["x"]
    assert not image.flags.writeable
    with pytest.raises(ValueError):
        image[0] = 1


@pytest.mark.parametrize("value", [np.array([object()], dtype=object), np.zeros(2, np.complex64),
                                   np.zeros(2, dtype=[("a", "<i4")])])
def test_refuses_to_send_unsafe_dtypes(value):
    with pytest.raises(ProtocolError, match="cannot send"):
        packb({"x": value})


def _raw(obj) -> bytes:
    return msgpack.packb(obj)


@pytest.mark.parametrize("message, match", [
    (_raw({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}), "refused dtype"),
    (_raw({b"__ndarray__": True, b"data": b"\0" * 16, b"dtype": "<c8", b"shape": [2]}), "refused dtype"),
    (_raw({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<f4", b"shape": [1000000]}), "needs 4000000 bytes"),
    (_raw({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<f4", b"shape": [-2]}), "shape"),
    (_raw({b"__ndarray__": True, b"data": "text", b"dtype": "<f4", b"shape": [1]}), "data must be bytes"),
    (_raw({b"__ndarray__": True, b"data": b"", b"dtype": "nonsense", b"shape": [0]}), "unknown dtype"),
    (_raw({b"__npgeneric__": True, b"data": [1], b"dtype": "<i8"}), "plain value"),
    (_raw({b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"}), "cannot make"),
    (b"\xc1", "not a msgpack message"),
    (packb({"a": 1}) + b"\x00", "not a msgpack message"),
    (_raw({1: 2}), "not a msgpack message"),
])
def test_refuses_malformed_messages(message, match):
    with pytest.raises(ProtocolError, match=match):
        unpackb(message)
