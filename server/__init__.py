"""The Turnwire sidecar: configuration, gRPC API, turn engine, providers, tools and stores.

Entry points: the ``turnwire`` command (:mod:`server.cli`) and
:func:`server.app.start` for embedding the sidecar in a Python process.
"""
