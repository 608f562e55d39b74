"""What the server serves: a ``ServedPolicy`` checks one observation at a time and infers a batch of them.

The server calls ``check`` on each request as it arrives (a request that does not fit is answered with an error
and never reaches a batch) and ``infer`` on batches of checked requests, in one worker thread. A policy keeps no
state between calls: action queues and replanning live in the client.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from longboat.errors import LongboatError
from longboat.serving.protocol import PROMPT_KEY, SEED_KEY

MAX_SEED = (1 << 63) - 1


class RequestError(LongboatError, ValueError):
    """A request the policy cannot answer (a key missing or unexpected, a wrong shape or dtype); the message is
    sent to that client alone."""


class ServedPolicy(Protocol):
    metadata: dict  # sent to every client when it connects (openpi clients read it with get_server_metadata)

    def check(self, obs: dict) -> None:
        """Raise ``RequestError`` when ``obs`` (one request, seed removed) does not fit the policy."""

    def infer(self, observations: list[dict], seeds: list[int]) -> list[dict]:
        """One result per observation, at least ``{"actions": array [horizon, action_dim]}``. A request's result
        depends on its observation and seed only, never on its batch mates."""


def check_keys(obs: dict, expected: list[str] | dict, optional: tuple[str, ...] = (PROMPT_KEY,)) -> None:
    missing = [k for k in expected if k not in obs]
    unexpected = [k for k in obs if k not in expected and k not in optional]
    if missing or unexpected:
        raise RequestError(f"observation keys do not match the policy: missing {missing}, unexpected {unexpected}; "
                           f"expected {list(expected)} (optional: {list(optional)})")


def array_of(obs: dict, key: str, kinds: str = "buif") -> np.ndarray:
    """``obs[key]`` as a numpy array of a numeric dtype."""
    value = obs[key]
    if isinstance(value, (list, tuple, int, float)):
        try:
            value = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError):
            raise RequestError(f"'{key}': expected numbers, got a ragged or non-numeric list") from None
    if not isinstance(value, np.ndarray) or value.dtype.kind not in kinds:
        got = f"dtype {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
        raise RequestError(f"'{key}': expected a numeric array, got {got}")
    return value


def checked_array(obs: dict, key: str, kinds: str = "buif") -> np.ndarray:
    """``array_of`` for a request's check: also refuses NaN, infinite and float32-overflowing values, which a policy
    would answer with NaN actions. Vectorised over the array."""
    x = array_of(obs, key, kinds)
    if x.dtype.kind == "f":
        ok = np.isfinite(x)
        if x.dtype.itemsize > 4:  # the policy reads float32: a larger value would become infinite
            ok &= np.abs(x) <= np.finfo(np.float32).max
        if not ok.all():
            raise RequestError(f"'{key}': expected finite numbers within float32's range, got "
                               f"{x.size - int(np.count_nonzero(ok))} NaN, infinite or too large of {x.size}")
    return x


def image_tensor(obs: dict, key: str, channels: int | None = None) -> torch.Tensor:
    """A wire image, channel-last [..., H, W, C] as openpi clients send it (or channel-first [..., C, H, W] where
    the shape says so), uint8 or float in [0, 1], as float32 [..., C, H, W] in [0, 1]."""
    x = array_of(obs, key, "uf")
    if x.ndim < 3:
        raise RequestError(f"'{key}': expected an image [H, W, C], got shape {list(x.shape)}")
    chans = (channels,) if channels is not None else (1, 3, 4)
    channel_last = x.shape[-1] in chans or x.shape[-3] not in chans
    if (x.shape[-1] if channel_last else x.shape[-3]) not in chans:
        raise RequestError(f"'{key}': expected {' or '.join(map(str, chans))} channels, got shape {list(x.shape)}")
    t = torch.from_numpy(x.astype(np.float32))  # a copy: decoded arrays are read-only views of the message
    if channel_last:
        t = t.movedim(-1, -3).contiguous()
    return t.div_(255) if x.dtype.kind == "u" else t


def vector_tensor(obs: dict, key: str, dim: int | None = None) -> torch.Tensor:
    """A wire vector [..., D] (any numeric dtype) as float32."""
    x = array_of(obs, key)
    if x.ndim < 1 or (dim is not None and x.shape[-1] != dim):
        raise RequestError(f"'{key}': expected a vector [{dim if dim is not None else 'D'}], "
                           f"got shape {list(x.shape)}")
    return torch.from_numpy(x.astype(np.float32))


def prompt_of(obs: dict) -> str:
    value = obs.get(PROMPT_KEY, "")
    if isinstance(value, np.ndarray) and value.dtype.kind in "SU" and value.size == 1:
        value = value.item()
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise RequestError(f"'{PROMPT_KEY}': expected a string, got {type(value).__name__}")
    return value


def seed_of(request: dict) -> int | None:
    """The request's seed, removed from it; None when it carries none."""
    value = request.pop(SEED_KEY, None)
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise RequestError(f"'{SEED_KEY}': expected an integer in [0, 2**63), got {value!r}")
    return value


def to_numpy(value: Any) -> Any:
    """Tensors in a result as float32/int numpy arrays on the CPU, for the wire."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return (value.float() if value.is_floating_point() else value).numpy()
    return value
