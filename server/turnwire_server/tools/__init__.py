"""Tool homes the sidecar serves from: the tool set built from configuration, and the demo tools.

The tool interface itself (``Tool``, ``tool``, ``ToolExecution``) is public, in
:mod:`turnwire.tools`. Importing this package loads no tool; import
:mod:`turnwire_server.tools.demo` for the demo set.
"""
