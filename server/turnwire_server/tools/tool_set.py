"""The server's tool set: in-process tools, then tool sources in other processes, merged by name.

docs/semantics.md §2: the server's own tools (demo, ``tools.python``), then each tool host
(``tools.hosts``) and each MCP server (``tools.mcp``) in config order; a later source's tool
replaces an earlier one of the same name. The request's client tools come after all of these,
per turn (``engine/client_tools.py``). A source's tools change when it is (re-)listed, so the
set is a live :class:`~collections.abc.Mapping` the engine reads at the start of every turn;
a running turn keeps the tools it started with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from turnwire.tools import Tool
from turnwire_server.tools.loading import ApprovalRequired

log = logging.getLogger("turnwire.tools")


class ToolSource(Protocol):
    """Tools served by another process (a tool host, an MCP server).

    ``tools`` is what the source's last successful listing gave (empty before the first).
    :meth:`start` makes the first listing, within the source's start-up timeout, and keeps the
    source current from then on (re-listing, reconnecting, restarting); it returns whether the
    first listing succeeded, and never raises for an unreachable source. :meth:`aclose` stops
    it and releases its connection or process.
    """

    name: str
    kind: str

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The source's tools by name."""
        ...

    async def start(self) -> bool:
        """List the tools for the first time; True when that worked."""
        ...

    async def aclose(self) -> None:
        """Stop the source (idempotent)."""
        ...


class ToolSet(Mapping[str, Tool]):
    """``local`` tools, then those of each of :attr:`sources` in order, as one mapping by name (see
    the module docstring).

    Tools named in ``require_approval`` wait for the client's approval, whichever source serves
    them (docs/semantics.md §6). Append the sources to :attr:`sources` before :meth:`start`; each
    calls :meth:`refresh` after its listings.
    """

    def __init__(self, local: Mapping[str, Tool], require_approval: Iterable[str] = ()) -> None:
        self.local = dict(local)
        self.sources: list[ToolSource] = []
        self.require_approval = frozenset(require_approval)
        self._merged: dict[str, Tool] = {}
        self._overrides: set[str] = set()
        self.refresh()

    def refresh(self) -> None:
        """Merge the sources' current tools again (a source calls this after each listing)."""
        merged: dict[str, Tool] = dict(self.local)
        origin = dict.fromkeys(self.local, "the server's tools")
        overrides: set[str] = set()
        for source in self.sources:
            for name, tool in source.tools.items():
                here = f"{source.kind} {source.name!r}"
                if name in origin:
                    overrides.add(f"tool {name!r} of {here} overrides the one of {origin[name]}")
                merged[name] = tool
                origin[name] = here
        for name in self.require_approval & merged.keys():
            merged[name] = ApprovalRequired(merged[name])
        self._merged = merged
        for line in sorted(overrides - self._overrides):  # said once, not at every re-listing
            log.info("%s", line)
        self._overrides = overrides

    async def start(self) -> list[ToolSource]:
        """Start every source at once (first listings); the sources whose first listing failed."""
        listed = await asyncio.gather(*(source.start() for source in self.sources))
        self.refresh()
        return [source for source, ok in zip(self.sources, listed, strict=True) if not ok]

    async def aclose(self) -> None:
        """Stop every source (connections closed, MCP server processes ended)."""
        await asyncio.gather(*(source.aclose() for source in self.sources), return_exceptions=True)

    def __getitem__(self, name: str) -> Tool:
        return self._merged[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._merged)

    def __len__(self) -> int:
        return len(self._merged)

    def __contains__(self, name: object) -> bool:
        return name in self._merged
