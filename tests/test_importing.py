"""Configured ``package.module:attribute`` paths that do not import say what is wrong and the close
name (a fresh-user trial: ``myapp.tool:lookup_stock`` with myapp.py importable was told to fix
PYTHONPATH; ``myapp.hooks:Audti`` got a bare AttributeError; a plain-string middleware entry got
a pydantic message about dictionaries)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from turnwire_server.assembly import StartupError, load_middlewares
from turnwire_server.config import MiddlewareEntry, load_settings
from turnwire_server.importing import import_object
from turnwire_server.tools.loading import ToolLoadError, load_tools

HOOKS = """
from turnwire.hooks import Middleware

class Audit(Middleware):
    pass
"""

TOOLS = """
from pydantic import BaseModel
from turnwire.tools import tool

class Stock(BaseModel):
    sku: str

@tool(Stock)
def lookup_stock(input: Stock) -> int:
    return 3
"""


@pytest.fixture
def user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``twapp_mod.py`` (a module with a tool) and ``twapp_pkg/`` (a package with ``hooks``),
    importable from ``tmp_path``; removed from ``sys.modules`` afterwards."""
    (tmp_path / "twapp_mod.py").write_text(TOOLS)
    (tmp_path / "twapp_pkg").mkdir()
    (tmp_path / "twapp_pkg" / "__init__.py").write_text("")
    (tmp_path / "twapp_pkg" / "hooks.py").write_text(HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith(("twapp_mod", "twapp_pkg"))]:
        del sys.modules[name]


def test_a_missing_top_level_module_says_pythonpath() -> None:
    with pytest.raises(ModuleNotFoundError, match=r"put the folder that holds twapp_absent\.py .*PYTHONPATH"):
        import_object("twapp_absent:thing")


def test_a_submodule_of_a_plain_module_says_it_is_not_a_package_and_where_the_colon_goes(
    user_code: Path,
) -> None:
    with pytest.raises(ModuleNotFoundError) as raised:
        import_object("twapp_mod.tool:lookup_stock")
    message = str(raised.value)
    assert "module 'twapp_mod.tool' does not exist" in message
    assert "is a module, not a package" in message
    assert "did you mean twapp_mod:lookup_stock?" in message
    assert "PYTHONPATH" not in message


def test_a_misspelt_submodule_of_a_package_gets_the_close_module_name(user_code: Path) -> None:
    with pytest.raises(ModuleNotFoundError) as raised:
        import_object("twapp_pkg.hook:Audit")
    message = str(raised.value)
    assert "module 'twapp_pkg.hook' does not exist" in message
    assert "has no module 'hook'; did you mean twapp_pkg.hooks?" in message
    assert "PYTHONPATH" not in message


def test_a_misspelt_attribute_gets_the_close_public_name(user_code: Path) -> None:
    with pytest.raises(
        AttributeError, match=r"twapp_pkg.hooks has no attribute 'Audti'; did you mean Audit\?"
    ):
        import_object("twapp_pkg.hooks:Audti")


def test_a_module_that_imports_something_missing_is_reported_as_is(user_code: Path) -> None:
    (user_code / "twapp_pkg" / "broken.py").write_text("import twapp_not_installed\n")
    with pytest.raises(ModuleNotFoundError, match=r"No module named 'twapp_not_installed'$"):
        import_object("twapp_pkg.broken:x")


def test_a_tool_path_error_names_the_entry_and_the_close_name(user_code: Path) -> None:
    with pytest.raises(ToolLoadError) as raised:
        load_tools(False, ["twapp_mod:lookup_stok"])
    assert str(raised.value) == (
        "python[0]: cannot import tool 'twapp_mod:lookup_stok': "
        "twapp_mod has no attribute 'lookup_stok'; did you mean lookup_stock?"
    )


def test_a_middleware_path_error_names_the_entry_and_the_close_name(user_code: Path) -> None:
    with pytest.raises(StartupError) as raised:
        load_middlewares([MiddlewareEntry(path="twapp_pkg.hooks:Audti")])
    assert str(raised.value) == (
        "middleware[0] twapp_pkg.hooks:Audti: twapp_pkg.hooks has no attribute 'Audti'; did you mean Audit?"
    )
    with pytest.raises(StartupError, match=r"does not exist.*did you mean twapp_pkg.hooks\?"):
        load_middlewares([MiddlewareEntry(path="twapp_pkg.hookz:Audit")])


def test_a_plain_string_middleware_entry_is_its_path(user_code: Path) -> None:
    config = user_code / "turnwire.yaml"
    config.write_text(yaml.safe_dump({"middleware": ["twapp_pkg.hooks:Audit"]}))
    settings = load_settings(config)
    assert settings.middleware == [MiddlewareEntry(path="twapp_pkg.hooks:Audit")]
    assert [type(m).__name__ for m in load_middlewares(settings.middleware)] == ["Audit"]
