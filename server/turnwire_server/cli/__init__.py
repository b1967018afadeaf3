"""The ``turnwire`` command: ``serve`` the sidecar, ``migrate`` its store, ``chat`` with it,
``continue``, ``cancel`` or ``resume`` a turn, list ``conversations``, read ``history``, check its ``health``,
run the ``demo``, ``config show``; ``--version``.

Modules: :mod:`.app` (the typer app and its global options), :mod:`.server_commands` and
:mod:`.client_commands` (the commands), :mod:`.connection` (the connection options, declared
once), :mod:`.turns` (the turn runners), :mod:`.live` (a turn rendered as it streams),
:mod:`.history` (stored conversations), :mod:`.parts` (how reply parts print),
:mod:`.errors` (errors in the CLI's terms), :mod:`.exit_codes`, :mod:`.demo`.
The CLI talks to the sidecar through :mod:`turnwire_client` only: it imports no part of the
server's API layer.
"""

import os

# gRPC's C core logs at info in its own format (a failed TLS handshake of a client command, a
# client's GOAWAY in serve), outside logging.level. It reads this when its first module that
# starts it is imported, which a command's imports may do: set before any of them.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from turnwire_server.cli.app import app, main

__all__ = ["app", "main"]
