"""A client of ``longboat serve`` (or any openpi-protocol server) that survives the server restarting; the chunk
schedule (``ActionChunks``: when to ask for a chunk, which action a step takes, ACT's temporal ensemble) that both
``ActionChunker`` (one action per call) and ``longboat eval``'s episodes follow.

``PolicyClient.infer`` sends one observation and returns the result. A dropped connection (the server restarted,
the network blinked) is reopened with exponential backoff until ``connect_timeout_s`` and the request is sent
again: the server keeps no per-client state, so a resent request is answered as the first would have been (with
the same seed, the same actions). An error the server reports about the request raises ``ServerError`` at once.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.frames import CloseCode
from websockets.sync.client import ClientConnection, connect

from longboat.errors import LongboatError
from longboat.serving.protocol import SEED_KEY, Packer, unpackb


# close codes that answer the request itself (too big, policy violation, server error): resending would not help
_REFUSED = (CloseCode.MESSAGE_TOO_BIG, CloseCode.POLICY_VIOLATION, CloseCode.INTERNAL_ERROR)


class ServerError(LongboatError, RuntimeError):
    """The server refused or failed the request (its message says why); resending it would fail the same way."""


class ServerUnavailable(LongboatError, ConnectionError):
    """No server answered within the connect deadline."""


class PolicyClient:
    def __init__(self, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                 timeout_s: float = 30.0, connect_timeout_s: float = 60.0, backoff_s: float = 0.05,
                 max_backoff_s: float = 2.0, max_resends: int = 3, max_message_bytes: int | None = None):
        self.uri = host if host.startswith("ws") else f"ws://{host}:{port}"
        self.api_key, self.timeout_s, self.connect_timeout_s = api_key, timeout_s, connect_timeout_s
        self.backoff_s, self.max_backoff_s, self.max_message_bytes = backoff_s, max_backoff_s, max_message_bytes
        self.max_resends, self.reconnects = max_resends, 0
        self._packer = Packer()
        self._ws: ClientConnection | None = None
        self.metadata: dict = {}
        self._connect()

    def _connect(self) -> None:
        """Open a connection and read the metadata frame, retrying with backoff until the deadline."""
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        deadline, delay, last = time.monotonic() + self.connect_timeout_s, self.backoff_s, None
        while True:
            try:
                ws = connect(self.uri, compression=None, max_size=self.max_message_bytes, additional_headers=headers,
                             proxy=None, open_timeout=max(1.0, min(10.0, deadline - time.monotonic())))
                try:
                    self.metadata = unpackb(ws.recv(timeout=self.timeout_s))
                except BaseException:
                    ws.close()
                    raise
                self._ws = ws
                return
            except InvalidStatus as e:  # the server answered but refused (a wrong API key): retrying will not help
                raise ServerError(f"{self.uri} refused the connection: HTTP {e.response.status_code} "
                                  f"{e.response.body.decode(errors='replace').strip()}") from None
            except (OSError, TimeoutError, WebSocketException) as e:
                last = e
            if time.monotonic() + delay > deadline:
                raise ServerUnavailable(f"no policy server at {self.uri} within {self.connect_timeout_s:g} s "
                                        f"({type(last).__name__}: {last})")
            time.sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)

    def infer(self, obs: dict, seed: int | None = None) -> dict:
        """The server's result for ``obs`` (``actions`` [horizon, A], ``seed``, timings)."""
        if seed is not None:
            obs = {**obs, SEED_KEY: seed}
        message, resends = self._packer.pack(obs), 0
        while True:
            if self._ws is None:
                self._connect()
                self.reconnects += 1
            try:
                self._ws.send(message)
                reply = self._ws.recv(timeout=self.timeout_s)
            except TimeoutError:
                self._drop()  # a late reply would answer the next request: start that one on a new connection
                raise TimeoutError(f"{self.uri}: no reply within {self.timeout_s:g} s") from None
            except ConnectionClosed as e:
                self._drop()
                if e.rcvd is not None and e.rcvd.code in _REFUSED:
                    raise ServerError(f"{self.uri} closed the connection: {e.rcvd.code} {e.rcvd.reason}") from None
                resends = self._resend(resends, e)
                continue
            except OSError as e:
                self._drop()
                resends = self._resend(resends, e)
                continue
            if isinstance(reply, str):
                self._drop()
                raise ServerError(f"{self.uri}: {reply.strip()}")
            return unpackb(reply)

    def _resend(self, resends: int, error: Exception) -> int:
        if resends >= self.max_resends:
            raise ServerUnavailable(f"{self.uri}: the connection dropped {resends + 1} times while sending one "
                                    f"request ({type(error).__name__}: {error})")
        return resends + 1

    def _drop(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ActionChunks:
    """One episode's action chunks and the action each step takes from them: the one schedule ``ActionChunker`` and
    ``longboat eval``'s episodes share.

    A chunk is asked for every ``replan`` steps (and whenever no chunk covers the step). Without ``ensemble`` a step
    takes its row of the newest chunk. With ``ensemble`` (ACT's temporal ensembling, LeRobot's
    ``temporal_ensemble_coeff``) every chunk covering the step votes, weighted ``exp(-ensemble * i)`` with ``i = 0``
    the oldest, and the weights normalised to sum to one; ACT asks every step (``replan=1``). The vote is computed in
    float64 and returned in the chunks' dtype.
    """

    def __init__(self, replan: int, ensemble: float | None = None):
        if replan < 1:
            raise ValueError(f"replan must be at least 1, got {replan}")
        if ensemble is not None and not math.isfinite(ensemble):
            raise ValueError(f"the temporal ensemble coefficient must be a finite number, got {ensemble}")
        self.replan, self.ensemble = replan, ensemble
        self.chunks: list[tuple[int, np.ndarray]] = []  # (step it was asked at, [horizon, A]), oldest first

    def reset(self) -> None:
        """Forget the episode's chunks (call between episodes)."""
        self.chunks = []

    def needs_chunk(self, t: int) -> bool:
        """Whether step ``t`` asks the policy for a new chunk."""
        return not self.chunks or t - self.chunks[-1][0] >= self.replan or not self._covering(t)

    def add(self, t: int, chunk) -> None:
        """The chunk asked at step ``t`` [horizon, A]; one shorter than ``replan`` is the server's error."""
        chunk = np.asarray(chunk)
        if chunk.ndim != 2 or self.replan > chunk.shape[0]:
            raise ServerError(f"expected an action chunk [horizon >= {self.replan}, A], got shape {list(chunk.shape)}")
        self.chunks.append((t, chunk))

    def action(self, t: int) -> np.ndarray:
        """Step ``t``'s action [A] (steps go forward: chunks that no longer cover ``t`` are dropped)."""
        self.chunks = covering = self._covering(t)
        if not covering:
            raise ValueError(f"no action chunk covers step {t}: ask for one first (needs_chunk)")
        if self.ensemble is None:
            start, chunk = covering[-1]
            return chunk[t - start]
        actions = np.stack([chunk[t - start] for start, chunk in covering]).astype(np.float64)
        exponents = -self.ensemble * np.arange(len(covering), dtype=np.float64)
        weights = np.exp(exponents - exponents.max())  # the same ratios; no overflow for a negative coefficient
        vote = (weights[:, None] * actions).sum(0) / weights.sum()
        return vote.astype(np.result_type(*(chunk.dtype for _, chunk in covering)), copy=False)

    def _covering(self, t: int) -> list[tuple[int, np.ndarray]]:
        return [(s, c) for s, c in self.chunks if s <= t < s + c.shape[0]]


class ActionChunker:
    """Steps a chunked policy one action per call, on ``ActionChunks``' schedule: a new chunk every
    ``replan_every`` steps (at most the horizon).

    With ``ensemble_decay`` set, every chunk that covers the current step votes, weighted ``exp(-decay * i)`` with
    ``i = 0`` the oldest (ACT's temporal ensembling; query every step with ``replan_every=1`` as ACT does).
    """

    def __init__(self, infer: Callable[[dict], dict], replan_every: int, ensemble_decay: float | None = None):
        if replan_every < 1:
            raise ValueError(f"replan_every must be at least 1, got {replan_every}")
        self.infer, self.replan_every, self.ensemble_decay = infer, replan_every, ensemble_decay
        self.chunks = ActionChunks(replan_every, ensemble_decay)
        self.reset()

    def reset(self) -> None:
        """Forget the episode's chunks (call between episodes)."""
        self.step_index = 0
        self.chunks.reset()

    def step(self, obs: dict, **infer_kwargs: Any) -> np.ndarray:
        """The action for this step [A]."""
        t = self.step_index
        if self.chunks.needs_chunk(t):
            self.chunks.add(t, self.infer(obs, **infer_kwargs)["actions"])
        self.step_index += 1
        return self.chunks.action(t)
