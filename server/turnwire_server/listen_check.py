"""Check the listen address before anything is opened or written.

gRPC core reports a port in use only when the server adds it, with a C-core log
line on stderr, after the store would already have been created and migrated.
Binding a plain socket first (``SO_REUSEADDR``, as gRPC core binds, and no
``SO_REUSEPORT``, which the server turns off) finds the same faults with a
message that says what to fix. A port taken between this check and the
server's own bind is still reported, less kindly, by :func:`turnwire_server.app.start`.
"""

from __future__ import annotations

import errno
import socket


class ListenAddressError(Exception):
    """The address cannot be listened on; the message says why and what to do."""


def host_port(value: str, example: str) -> str:
    """``value`` when it is a listen address: ``HOST:PORT`` (``[v6]:PORT``) with a port of 1-65535,
    or 0 for any free port. Raises :class:`ValueError` saying which part is wrong, with ``example``
    (for the configuration's validators: ``listen``, ``http.listen``, ``metrics.listen``)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port:
        raise ValueError(f"must be HOST:PORT, for example {example}")
    if not port.isdigit() or int(port) > 65535:
        wrong = f"port {port} is out of range" if port.isdigit() else f"port {port!r} is not a number"
        raise ValueError(f"{wrong}: use a port of 1-65535, or 0 for any free port (for example {example})")
    return value


def check_listen_address(listen: str) -> None:
    """Bind and release every address ``listen`` (``HOST:PORT``; ``[v6]:PORT``) resolves to.

    Port 0 (any free port) is not checked. Raises :class:`ListenAddressError` when the port is
    in use, the host is not an address of this machine, or the name does not resolve.
    """
    host, _, port_text = listen.rpartition(":")
    port = int(port_text)
    if port == 0:
        return
    host = host.removeprefix("[").removesuffix("]")
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ListenAddressError(
            f"cannot listen on {listen}: host {host!r} does not resolve ({error})"
        ) from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                raise ListenAddressError(_explain(listen, port, error)) from None


def hold_listen_address(listen: str) -> tuple[list[socket.socket], int]:
    """Bind, and keep bound, every address ``listen`` resolves to with ``SO_REUSEPORT``, without
    listening: processes that set ``SO_REUSEPORT`` too (``serve --workers N``'s workers) can bind
    and listen on the port, any other process cannot, and no connection is queued on these
    sockets. Port 0 takes a free port. Returns the sockets (the caller closes them) and the port.
    Call :func:`check_listen_address` first for its messages; raises :class:`ListenAddressError`.
    """
    host, _, port_text = listen.rpartition(":")
    port = int(port_text)
    host = host.removeprefix("[").removesuffix("]")
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ListenAddressError(
            f"cannot listen on {listen}: host {host!r} does not resolve ({error})"
        ) from None
    held: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in addresses:
            holder = socket.socket(family, kind, proto)
            held.append(holder)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                holder.bind((address[0], port, *address[2:]))
            except OSError as error:
                raise ListenAddressError(_explain(listen, port, error)) from None
            port = holder.getsockname()[1]  # port 0: every address gets the one the first got
    except BaseException:
        for holder in held:
            holder.close()
        raise
    return held, port


def _explain(listen: str, port: int, error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {listen}: port {port} is in use (another turnwire? "
            f"`ss -ltnp 'sport = :{port}'` shows which process); stop it or choose another port "
            "with --listen or listen:"
        )
    if error.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {listen}: that host is not an address of this machine; "
            "use 127.0.0.1 or 0.0.0.0"
        )
    if error.errno == errno.EACCES:
        return (
            f"cannot listen on {listen}: permission denied (ports below 1024 need privileges); "
            "use a port ≥ 1024"
        )
    return f"cannot listen on {listen}: {error.strerror or error}"
