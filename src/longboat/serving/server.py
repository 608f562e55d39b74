"""``PolicyServer``: the openpi websocket protocol (FORMATS.md §3), with batching off the event loop.

Per connection: the metadata frame first, then request/response; a request that fails (malformed msgpack, a text
frame, wrong keys, a bad seed, an exception in the policy) is answered with a text frame and a close with code 1011,
as openpi does: a bad request's message, or for a failure of the policy or server a short message with an error id
under which the traceback is logged (the client never sees the server's traceback); an oversize frame is refused
before it is read (close code 1009, the limit in the reason). Other connections are not affected. ``GET /healthz``
answers 200.

Requests from all connections meet in one queue, read by one worker thread: it takes the first, waits up to
``batch_window_ms`` for more (``max_batch`` at most, and never for more requests than there are connected clients,
so a lone client waits for nobody; a window of 0 serves one request at a time) and hands the batch to the policy,
while the event loop keeps reading, decoding, checking and answering.
"""

from __future__ import annotations

import asyncio
import hmac
import http
import logging
import os
import queue
import secrets
import threading
import time
import traceback
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from pydantic import Field
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from longboat.config.base import StrictModel
from longboat.serving.addresses import bind_error
from longboat.serving.protocol import HEALTH_PATH, SEED_KEY, Packer, ProtocolError, unpackb
from longboat.serving.served import MAX_SEED, RequestError, ServedPolicy, seed_of, to_numpy

log = logging.getLogger("longboat.serve")


class ServerConfig(StrictModel):
    host: str = Field(default="127.0.0.1", description="address to bind (0.0.0.0: every interface)")
    port: int = Field(default=8000, ge=0, le=65535, description="0: any free port")
    batch_window_ms: float = Field(default=2.0, ge=0, description="how long a batch waits for more requests; 0: off")
    max_batch: int = Field(default=32, gt=0)
    deterministic: bool = Field(default=False, description="each request in a forward pass of its own: its actions "
                                "never depend on which requests arrive with it (batching off)")
    max_message_bytes: int = Field(default=32 << 20, gt=0, description="larger frames are refused unread")
    api_key: str | None = Field(default=None, description="required as 'Authorization: Api-Key <key>' when set")


@dataclass
class _Pending:
    obs: dict
    seed: int
    future: asyncio.Future


@dataclass
class ServerStats:
    forward_passes: int = 0
    requests: int = 0
    errors: int = 0
    batch_sizes: Counter[int] = field(default_factory=Counter)  # size -> forward passes: bounded by max_batch


class PolicyServer:
    def __init__(self, policy: ServedPolicy, cfg: ServerConfig | None = None):
        self.policy, self.cfg = policy, cfg or ServerConfig()
        self.stats = ServerStats()
        self._metadata = Packer().pack(dict(policy.metadata))
        self._requests: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._connections = 0

    async def serve(self, ready: asyncio.Future | None = None, stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set (or the task is cancelled); ``ready`` receives the bound port."""
        worker = threading.Thread(target=self._work, args=(asyncio.get_running_loop(),), name="longboat-infer",
                                  daemon=True)
        worker.start()
        try:
            try:
                listening = await serve(self._handle, self.cfg.host, self.cfg.port, compression=None,
                                        max_size=self.cfg.max_message_bytes, process_request=self._process_request)
            except OSError as e:
                raise bind_error(self.cfg.host, self.cfg.port, e) from None
            async with listening as server:
                port = _bound_port(server)
                batching = ("deterministic: one request per forward pass" if self.cfg.deterministic else
                            f"batch window {self.cfg.batch_window_ms:g} ms, max batch {self.cfg.max_batch}")
                log.info("serving on ws://%s:%d (pid %d, %s)", self.cfg.host, port, os.getpid(), batching)
                if ready is not None:
                    ready.set_result(port)
                await (stop.wait() if stop is not None else asyncio.Future())
        finally:
            self._requests.put(None)  # the worker ends after the batch it is computing

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path == HEALTH_PATH:
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self.cfg.api_key is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Api-Key {self.cfg.api_key}".encode()):
                return connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong API key\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        packer = Packer()
        await ws.send(self._metadata)
        prev_total_ms = None
        self._connections += 1
        try:
            async for message in ws:
                start = time.monotonic()
                try:
                    result = await self._answer(message)
                except Exception as e:  # this client's error: tell it, close its connection, serve the others
                    self.stats.errors += 1
                    await ws.send(_client_message(e, ws.remote_address))
                    await ws.close(CloseCode.INTERNAL_ERROR, "request failed; see the text frame")
                    return
                result["server_timing"] = {"infer_ms": (time.monotonic() - start) * 1000}
                if prev_total_ms is not None:
                    result["server_timing"]["prev_total_ms"] = prev_total_ms
                await ws.send(packer.pack(result))
                prev_total_ms = (time.monotonic() - start) * 1000
        except ConnectionClosed:
            pass
        finally:
            self._connections -= 1

    async def _answer(self, message: bytes | str) -> dict:
        if isinstance(message, str):
            raise ProtocolError("expected a binary msgpack frame, got a text frame")
        obs = unpackb(message)
        if not isinstance(obs, dict):
            raise ProtocolError(f"expected a map of observations, got {type(obs).__name__}")
        seed = seed_of(obs)
        if seed is None:
            seed = secrets.randbelow(MAX_SEED + 1)
        self.policy.check(obs)
        pending = _Pending(obs, seed, asyncio.get_running_loop().create_future())
        self._requests.put(pending)
        result, infer_ms = await pending.future
        return {**{k: to_numpy(v) for k, v in result.items()}, SEED_KEY: seed, "policy_timing": {"infer_ms": infer_ms}}

    def _work(self, loop: asyncio.AbstractEventLoop) -> None:
        """The worker thread: take a request, gather a batch within the window, infer, hand the results back to
        the event loop in one call. Batching here rather than on the loop saves a request a hop between tasks."""
        # Deterministic: a forward of one. A batched forward's row may differ in its last bits with the batch's size
        # and the row's place in it (matmul blocking), so served alone is the only way to be bitwise reproducible.
        window = 0.0 if self.cfg.deterministic else self.cfg.batch_window_ms / 1000
        while (first := self._requests.get()) is not None:
            batch, deadline = [first], time.monotonic() + window
            while window > 0 and len(batch) < min(self.cfg.max_batch, self._connections):
                remaining = deadline - time.monotonic()
                try:
                    pending = self._requests.get(timeout=remaining) if remaining > 0 else self._requests.get_nowait()
                except queue.Empty:
                    break
                if pending is None:
                    return
                batch.append(pending)
            batch = [p for p in batch if not p.future.cancelled()]  # a client that left is not computed for
            if batch:
                outcomes = self._infer(batch)
                try:
                    loop.call_soon_threadsafe(_settle, batch, outcomes)
                except RuntimeError:  # the loop closed while the batch computed: the server has stopped
                    return

    def _infer(self, batch: list[_Pending]) -> list:
        """In the worker thread: the batch in one call; if it fails, each request alone, so only the request that
        caused it gets the error."""
        try:
            return self._call([p.obs for p in batch], [p.seed for p in batch])
        except Exception as e:
            if len(batch) == 1:
                return [e]
        return [self._infer([p])[0] for p in batch]

    def _call(self, observations: list[dict], seeds: list[int]) -> list[tuple[dict, float]]:
        start = time.perf_counter()
        results = self.policy.infer(observations, seeds)
        infer_ms = (time.perf_counter() - start) * 1000
        self.stats.forward_passes += 1
        self.stats.requests += len(observations)
        self.stats.batch_sizes[len(observations)] += 1
        if len(results) != len(observations):
            raise RuntimeError(f"the policy returned {len(results)} results for {len(observations)} observations")
        return [(r, infer_ms) for r in results]

    def run(self, stop_on_eof: BinaryIO | None = None) -> None:
        """Serve in the foreground until interrupted (Ctrl-C or SIGTERM) or, given ``stop_on_eof``, until that
        stream ends: a process that starts the server holds the write end of its stdin, so the server stops when that
        process dies, however it died (SIGKILL included)."""
        import signal

        async def main():
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            if stop_on_eof is not None:
                threading.Thread(target=_wait_for_eof, args=(stop_on_eof, loop, stop), name="longboat-stdin",
                                 daemon=True).start()
            await self.serve(stop=stop)
            log.info("stopped after %d requests in %d forward passes", self.stats.requests, self.stats.forward_passes)

        asyncio.run(main())


@contextmanager
def serving_in_thread(server: PolicyServer, timeout: float = 30.0) -> Iterator[int]:
    """Run ``server`` on an event loop in a background thread; yields the bound port, stops on exit."""
    loop = asyncio.new_event_loop()
    ready: asyncio.Future = loop.create_future()
    stop = asyncio.Event()
    task_done = threading.Event()

    def run():
        try:
            loop.run_until_complete(server.serve(ready, stop))
        except BaseException as e:  # surfaced to the caller through ``ready``
            if not ready.done():
                ready.set_exception(e)
        finally:
            task_done.set()

    thread = threading.Thread(target=run, name="longboat-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not ready.done() and not task_done.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not ready.done():
        raise TimeoutError(f"the server did not start within {timeout:g} s")
    port = ready.result()
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        loop.close()


def _wait_for_eof(stream: BinaryIO, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """In a thread: read ``stream`` to its end, then stop the server (its parent closed the pipe or died). Its file
    descriptor is read directly where it has one: a buffered stream stays locked while this thread waits in it, and
    the interpreter, ending after a SIGTERM with this thread still waiting, aborts ("could not acquire lock")."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # no descriptor (an in-memory stream): read it as it is
        fd = None
    try:
        while os.read(fd, 4096) if fd is not None else stream.read(4096):
            pass
    except (OSError, ValueError):  # closed under us: the same as its end
        pass
    log.info("stdin closed: the process that started this server has ended; stopping")
    try:
        loop.call_soon_threadsafe(stop.set)
    except RuntimeError:  # the loop has already closed
        pass


def _client_message(e: Exception, remote) -> str:
    """What the client is told of its failed request: a bad request's own message; for a failure of the server or
    the policy, a short message and an id under which the traceback is logged here (the client does not get to read
    the server's code, paths or state)."""
    if isinstance(e, (ProtocolError, RequestError)):
        log.warning("request from %s refused: %s", remote, e)
        return f"{type(e).__name__}: {e}"
    error_id = secrets.token_hex(6)
    log.error("request from %s failed (error id %s):\n%s", remote, error_id,
              "".join(traceback.format_exception(e)).rstrip())
    return f"internal server error (error id {error_id}): the request could not be answered; the server's log " \
           f"has the details under this id"


def _settle(batch: list[_Pending], outcomes: list) -> None:
    for pending, outcome in zip(batch, outcomes):
        if pending.future.done():  # its client left
            continue
        if isinstance(outcome, BaseException):
            pending.future.set_exception(outcome)
        else:
            pending.future.set_result(outcome)


def _bound_port(server: Server) -> int:
    return next(iter(server.sockets)).getsockname()[1]
