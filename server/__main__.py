"""``python -m server`` is the ``turnwire`` command."""

from server.cli import main

main()
