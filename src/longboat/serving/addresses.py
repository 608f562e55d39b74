"""What a failed bind or an unresolvable host means to the user, for the server and the process that starts it
(kept apart from the server so that importing it loads no torch)."""

from __future__ import annotations

import errno
import socket

from longboat.config.base import ConfigError
from longboat.errors import LongboatError, WorldError


def check_host(host: str) -> None:
    """Refuse a ``--host`` that does not resolve, before the policy is loaded."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"--host {host}: cannot resolve this address ({getattr(e, 'strerror', None) or e})") \
            from None


def bind_error(host: str, port: int, e: OSError) -> LongboatError:
    """What a failed bind means to the user: a port in use (or forbidden) is the world's, an address that is not
    this machine's is a bad value."""
    if isinstance(e, socket.gaierror):
        return ConfigError(f"--host {host}: cannot resolve this address ({e.strerror or e})")
    if e.errno == errno.EADDRNOTAVAIL:
        return ConfigError(f"--host {host}: not an address of this machine; use 127.0.0.1, 0.0.0.0 or one of "
                           f"its interfaces' addresses")
    if e.errno == errno.EADDRINUSE:
        return WorldError(f"--port {port}: already in use on {host}; stop what listens there or choose another "
                          f"port (0: any free one)")
    return WorldError(f"cannot listen on {host}:{port}: {e.strerror or e}")
