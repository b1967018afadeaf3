"""Hook servers and tool hosts in Python: the ``turnwire.v1`` ``TurnHooksService`` and
``ToolExecutorService`` the sidecar calls (docs/api/kit-python.md).

- :class:`HookServer`: override the hooks you implement; the subscriptions follow;
  :func:`allow`, :func:`block`, :func:`substitute` are before_tool_call's decisions,
  :func:`tool_input` / :func:`tool_output` parse a call's JSON exactly.
- Tools are :class:`turnwire.tools.Tool` objects (``@tool(Model)``), served by :class:`ToolHost`.
- :func:`start` / :func:`run` serve both on one gRPC server.
- :func:`call_info`, inside a hook or tool: the call's metadata, the turn's request id to forward
  when calling back into the sidecar, and its W3C trace context.

The kit's own conformance suite is clients/conformance/kits (SPEC.md).
"""

from turnwire.kit.calls import CallInfo, call_info
from turnwire.kit.hook_server import HookServer, allow, block, substitute, tool_input, tool_output
from turnwire.kit.serving import Served, run, start
from turnwire.kit.tool_host import ToolHost, tool_spec

__all__ = [
    "CallInfo",
    "HookServer",
    "Served",
    "ToolHost",
    "allow",
    "block",
    "call_info",
    "run",
    "start",
    "substitute",
    "tool_input",
    "tool_output",
    "tool_spec",
]
