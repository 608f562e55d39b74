"""``ServerManager``: runs ``longboat serve`` as a child process and keeps it up for an evaluation.

The child runs in its own process group (a signal meant for it reaches whatever it started, and a Ctrl-C meant for
the evaluation does not kill it mid-request), writes to a log file, and counts as started when ``GET /healthz``
answers. The child stops when this process ends, however it ends (SIGKILL included): this process holds the pipe
to its stdin, whose end stops the server (``--exit-with-stdin``). A watchdog restarts it when it dies or stops
answering; ``stop`` sends SIGTERM to the group, then SIGKILL after a grace period. Clients reconnect on their own
(``PolicyClient``), so a restart costs them a retry.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from longboat.errors import LongboatError
from longboat.serving.addresses import bind_error
from longboat.serving.protocol import HEALTH_PATH

log = logging.getLogger("longboat.serve")


class ServerStartError(LongboatError, RuntimeError):
    """The server did not answer its health check in time (its log says why)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a server that must keep its port across restarts."""
    with socket.socket() as s:
        try:
            s.bind((host, 0))
        except OSError as e:
            raise bind_error(host, 0, e) from None
        return s.getsockname()[1]


class ServerManager:
    def __init__(self, serve_args: list[str], log_file: str | Path, *, host: str = "127.0.0.1",
                 port: int | None = None, startup_timeout_s: float = 120.0, check_every_s: float = 1.0,
                 unresponsive_after_s: float = 10.0, stop_grace_s: float = 10.0, env: dict | None = None):
        """``serve_args``: what follows ``longboat serve`` (the export, or ``--random-policy``, and options other
        than ``--host``/``--port``, which the manager sets)."""
        self.serve_args, self.log_file = list(serve_args), Path(log_file)
        self.host, self.port = host, port or free_port(host)
        self.startup_timeout_s, self.check_every_s = startup_timeout_s, check_every_s
        self.unresponsive_after_s, self.stop_grace_s = unresponsive_after_s, stop_grace_s
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.port}{HEALTH_PATH}", timeout=timeout) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def start(self) -> ServerManager:
        """Start the server and wait for its health check; then watch it."""
        with self._lock:
            self._launch()
        if self._watchdog is None:
            self._stopping.clear()
            self._watchdog = threading.Thread(target=self._watch, name="longboat-serve-watchdog", daemon=True)
            self._watchdog.start()
        return self

    def _launch(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "longboat", "serve", *self.serve_args, "--host", self.host,
               "--port", str(self.port), "--exit-with-stdin"]
        with open(self.log_file, "ab") as out:
            out.write(f"\n[manager] {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
            out.flush()
            # This process holds the write end of the child's stdin and never writes to it: when this process ends,
            # however it ends, the pipe closes and the child stops (--exit-with-stdin).
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                          env=self.env, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                _close_stdin(self._proc)
                raise ServerStartError(f"longboat serve exited with status {self._proc.returncode} before it "
                                       f"answered{_its_error(self.log_file)}; see {self.log_file}")
            if self.healthy(timeout=1.0):
                log.info("policy server up on %s:%d (pid %d)", self.host, self.port, self._proc.pid)
                return
            time.sleep(0.1)
        self._terminate()
        raise ServerStartError(f"longboat serve did not answer {HEALTH_PATH} within {self.startup_timeout_s:g} s; "
                               f"see {self.log_file}")

    def _watch(self) -> None:
        last_ok = time.monotonic()
        while not self._stopping.wait(self.check_every_s):
            with self._lock:
                if self._stopping.is_set() or self._proc is None:
                    return
                dead = self._proc.poll() is not None
                if not dead and self.healthy():
                    last_ok = time.monotonic()
                    continue
                if not dead and time.monotonic() - last_ok < self.unresponsive_after_s:
                    continue
                why = f"exited with status {self._proc.returncode}" if dead else \
                    f"did not answer for {self.unresponsive_after_s:g} s"
                log.warning("policy server %s; restarting it (see %s)", why, self.log_file)
                self._terminate()
                # Counted before the launch: a client can be served by the new server before _launch returns.
                self.restarts += 1
                try:
                    self._launch()
                except ServerStartError as e:
                    log.error("%s", e)  # tried again at the next check
                last_ok = time.monotonic()

    def _terminate(self) -> None:
        """SIGTERM to the child's process group, SIGKILL after the grace period."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            _close_stdin(proc)
            return
        for sig, wait in ((signal.SIGTERM, self.stop_grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        _close_stdin(proc)

    def stop(self) -> None:
        self._stopping.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join()
        self._watchdog = None
        with self._lock:
            self._terminate()
            self._proc = None

    def __enter__(self) -> ServerManager:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _its_error(log_file: Path) -> str:
    """The server's own ``error:`` line in its log, if it ended with one."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()[-20:]
    except OSError:
        return ""
    said = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    return f" ({said[-1]})" if said else ""


def _close_stdin(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
