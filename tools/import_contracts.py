"""import-linter contract types for what the built-in ones cannot say.

- :class:`OnlyImportsFrom`, an allow-list: the engine may import, of the server's own modules,
  only the interfaces named, so a module added beside a concrete part is forbidden without
  anyone listing it.
- :class:`ForbiddenExternalSubpackages`: a subpackage of an external package (``google.rpc``
  while ``google.protobuf`` stays allowed).

Registered in ``[tool.importlinter]`` of ``pyproject.toml`` (``contract_types``), checked by
``lint-imports`` (docs/architecture.md, "Layers").

The rest of this docstring is about :class:`ForbiddenExternalSubpackages`.

import-linter squashes every external package to its top-level name (``google``), so its
``forbidden`` contract refuses ``google.rpc`` as an option. This contract reads the import lines
grimp recorded instead: a module "imports ``google.rpc``" when one of its import statements of
``google`` names it. The contract is broken when a source module, or any module it imports
directly or indirectly, has such a line.

Its options: ``source_modules`` (packages, as in ``forbidden``), ``forbidden_modules`` (dotted names
of external subpackages, e.g. ``google.rpc``), ``wire_modules`` (optional: packages of generated
wire types whose own imports are not followed: the engine builds the contract's event messages,
and ``turnwire_client.v1.event_pb2`` imports ``google.rpc`` for ``TurnEnd.error``).
"""

from __future__ import annotations

import re
from typing import Any

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


class OnlyImportsFrom(Contract):
    """The modules of ``source_modules`` import, of ``container``'s modules, only their own
    package and the ``allowed_modules`` (each with its descendants). Direct imports are
    checked; what an allowed interface imports is the other contracts' business."""

    source_modules = fields.ListField(subfield=fields.StringField())
    container = fields.StringField()
    allowed_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        """Kept when no source module imports a module of the container outside the allowed
        ones; the metadata lists each such import with its lines."""
        sources = tuple(str(name) for name in self.source_modules)  # type: ignore[attr-defined]
        container = str(self.container)  # type: ignore[attr-defined]
        allowed = sources + tuple(str(name) for name in self.allowed_modules)  # type: ignore[attr-defined]
        found: list[dict[str, Any]] = []
        for source in sources:
            for importer in sorted({source} | graph.find_descendants(source)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if not _within(imported, (container,)) or _within(imported, allowed):
                        continue
                    details = graph.get_import_details(importer=importer, imported=imported)
                    lines = [f"l.{detail['line_number']}: {detail['line_contents']}" for detail in details]
                    found.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        """Print each import that is not allowed, with its lines."""
        for entry in check.metadata["found"]:
            output.print_error(f"{entry['importer']} is not allowed to import {entry['imported']}:")
            for line in entry["lines"]:
                output.print_error(f"-   {line}", bold=False)
            output.new_line()


def _within(module: str, packages: tuple[str, ...]) -> bool:
    """True when ``module`` is one of ``packages`` or inside one."""
    return any(module == name or module.startswith(name + ".") for name in packages)


class ForbiddenExternalSubpackages(Contract):
    """Source modules may not import, directly or through other modules of the graph, the named
    subpackages of external packages."""

    source_modules = fields.ListField(subfield=fields.StringField())
    forbidden_modules = fields.ListField(subfield=fields.StringField())
    wire_modules = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        """Kept when no module reachable from a source module has an import line naming a
        forbidden subpackage; the metadata lists each such module with the chain to it."""
        sources: list[str] = [str(name) for name in self.source_modules]  # type: ignore[attr-defined]
        forbidden: list[str] = [str(name) for name in self.forbidden_modules]  # type: ignore[attr-defined]
        wire: tuple[str, ...] = tuple(str(name) for name in self.wire_modules)  # type: ignore[attr-defined]
        offenders = _importers_of(graph, forbidden)
        found: list[dict[str, Any]] = []
        for source in sources:
            reachable = _reachable(graph, source, wire)
            for module in sorted(reachable & offenders.keys()):
                chain = _chain(graph, source, module)
                found.append({"source": source, "chain": chain, "lines": offenders[module]})
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        """Print each source, the chain of modules to the offending one, and its import lines."""
        for entry in check.metadata["found"]:
            output.print_error(f"{entry['source']} is not allowed to import {', '.join(entry['lines'])}:")
            output.print_error("-   " + " -> ".join(entry["chain"]), bold=False)
            output.new_line()


def _reachable(graph: ImportGraph, source: str, wire: tuple[str, ...]) -> set[str]:
    """``source``'s modules and every module they import, directly or not, without entering the
    ``wire`` packages."""

    def opaque(module: str) -> bool:
        return any(module == name or module.startswith(name + ".") for name in wire)

    seen = {source} | graph.find_descendants(source)
    todo = list(seen)
    while todo:
        for imported in graph.find_modules_directly_imported_by(todo.pop()):
            if imported not in seen and not opaque(imported):
                seen.add(imported)
                todo.append(imported)
    return seen


def _importers_of(graph: ImportGraph, forbidden: list[str]) -> dict[str, list[str]]:
    """Modules of the graph with an import line naming one of ``forbidden``, and those lines."""
    found: dict[str, list[str]] = {}
    for top in {name.split(".")[0] for name in forbidden}:
        if top not in graph.modules:
            continue
        named = re.compile(
            "|".join(
                rf"\b{re.escape(name)}\b|from\s+{re.escape(name.rpartition('.')[0])}\s+import\s+"
                rf"(?:\(\s*)?(?:[\w\s,]*,\s*)?{re.escape(name.rpartition('.')[2])}\b"
                for name in forbidden
            )
        )
        for importer in graph.find_modules_that_directly_import(top):
            lines = [
                f"{detail['line_contents']} (l.{detail['line_number']})"
                for detail in graph.get_import_details(importer=importer, imported=top)
                if named.search(detail["line_contents"])
            ]
            if lines:
                found[importer] = lines
    return found


def _chain(graph: ImportGraph, source: str, module: str) -> list[str]:
    """The shortest import chain from ``source`` (or one of its modules) to ``module``."""
    if module == source or module.startswith(source + "."):
        return [module]
    chains = graph.find_shortest_chains(importer=source, imported=module, as_packages=True)
    return list(min(chains, key=len)) if chains else [source, "…", module]
