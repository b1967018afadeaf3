"""``python -m server`` is the ``turnwire`` command."""

from turnwire_server.cli import main

main()
