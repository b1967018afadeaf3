"""The Turnwire sidecar: configuration, gRPC API, turn engine, providers, tools and stores.

Entry points: the ``turnwire`` command (:mod:`turnwire_server.cli`) and
:func:`turnwire_server.app.start` for embedding the sidecar in a Python process.
"""
