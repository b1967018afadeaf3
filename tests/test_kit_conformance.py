"""The kit conformance suite (clients/conformance/kits, SPEC.md): its cases valid against their
schema, naming existing configs, and covering the issue's list (decisions, failure modes of both
deciding hooks on both transports, deadlines, cancellation, streaming, big integers, tool errors,
every journal event); and its runner failing a kit that breaks the contract. `make kit-conformance`
(part of `make conformance` and `make test`) runs the suite against each kit's fixture."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from support.suite_runs import run_suite

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
KITS = REPO / "clients" / "conformance" / "kits"
JOURNAL_EVENTS = {
    "before_turn",
    "before_step",
    "before_tool_call",
    "after_tool_call",
    "on_step_finish",
    "on_chunks",
    "on_chat_response",
    "tool_call",
    "tool_cancelled",
}


def _cases() -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted((KITS / "cases").glob("*.json"))]


def test_every_case_fits_the_schema_and_names_its_configs() -> None:
    schemas = [
        json.loads(path.read_text()) for path in (KITS.parent / "case.schema.json", KITS / "case.schema.json")
    ]
    registry: Registry[Any] = Registry().with_resources(
        (schema["$id"], Resource.from_contents(schema)) for schema in schemas
    )
    validator = jsonschema.Draft202012Validator(schemas[1], registry=registry)
    jsonschema.Draft202012Validator.check_schema(schemas[1])
    names = set()
    for case in _cases():
        validator.validate(case)
        for config in case["configs"]:
            assert (KITS / "configs" / f"{config}.json").is_file(), case["name"]
        assert case["name"] not in names, f"two cases named {case['name']}"
        names.add(case["name"])


def test_the_cases_cover_the_contract() -> None:
    cases = _cases()
    steps = [step for case in cases for step in case["steps"]]
    assert {step["journal"].get("event") for step in steps if "journal" in step} - {None} == JOURNAL_EVENTS
    assert {step["fixture"] for step in steps if "fixture" in step} == {
        "GetHookSubscriptions",
        "ListTools",
        "BeforeTurn",
        "HookSession",
    }
    # A failing hook's status is the same in every kit: UNKNOWN, on both paths (SPEC.md §2).
    failures = [
        step["expect"]
        for step in steps
        if step.get("fixture") in ("BeforeTurn", "HookSession") and "on purpose" in json.dumps(step["expect"])
    ]
    assert failures == [
        {"failure": {"code": "UNKNOWN", "message": "fixture: before_turn failed on purpose"}},
        {
            "response": {
                "answers": [
                    {"id": "1", "error": {"code": 2, "message": "fixture: before_turn failed on purpose"}}
                ]
            }
        },
    ]
    # Each deciding hook's failure, sleeping past its deadline and raising, fails open and closed,
    # over HookSession (config `session`) and unary RPCs (`unary`), as the configs set the modes.
    names = {case["name"]: case["configs"] for case in cases}
    for hook in ("before-turn", "before-tool-call"):
        for how in ("sleep", "fail"):
            assert {config for mode in ("open", "closed") for config in names[f"{hook}-{how}-{mode}"]} == {
                "session",
                "unary",
            }
    for case in (
        "system-prompt",
        "block-tool",
        "edit-tool-input",
        "streaming-tool",
        "tool-error",
        "cancel-slow-tool",
    ):
        assert names[case] == ["session", "unary"], case
    scripts = json.loads((KITS / "configs" / "common.json").read_text())["providers"]["scripted"]["scripts"]
    called = {
        call["name"] for steps in scripts.values() for step in steps for call in step.get("tool_calls", [])
    }
    assert called == {"echo", "stream", "slow", "fail"}


def test_the_runner_fails_a_kit_that_rounds_big_integers(tmp_path: Path) -> None:
    """The Python fixture with big integers written as doubles by its tool host: the case that
    checks them fails, a case that holds passes, a wrong expectation fails, exit code 1."""
    shutil.copytree(KITS / "configs", tmp_path / "configs")
    (tmp_path / "cases").mkdir()
    by_name = {case["name"]: case for case in _cases()}
    wrong = json.loads(json.dumps(by_name["block-tool"]))
    wrong["name"] = "wrong-reason"
    wrong["steps"][0]["expect"]["everyOf"]["tool_output_available"][0]["outputJson"] = {"$json": "other"}
    for index, case in enumerate((by_name["listing"], by_name["edit-tool-input"], wrong)):
        (tmp_path / "cases" / f"{index:02d}.json").write_text(json.dumps({**case, "configs": ["session"]}))
    returncode, output = run_suite(
        [sys.executable, str(KITS / "run.py"), "--kit", "python"],
        {
            "TURNWIRE_KIT_CONFORMANCE_DIR": str(tmp_path),
            "TURNWIRE_KIT_FIXTURE_PYTHON": f"{sys.executable} tests/support/kit_fixture_rounding.py",
        },
    )
    assert returncode == 1, output
    assert "ok   listing [session]" in output, output
    assert "FAIL edit-tool-input [session]: step 1 (Chat): everyOf.tool_output_available" in output, output
    assert "FAIL wrong-reason [session]" in output, output
    assert "1 passed, 2 failed" in output, output
