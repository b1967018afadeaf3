"""The conformance suite's case files (clients/conformance): valid against case.schema.json, each
naming an existing config, and together covering every ChatService RPC and every terminal
TurnStatus (issue 15); and each runner reporting wrong expectations as failures. The runners run
the suite itself in `make conformance` (part of `make test`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support.suite_runs import run_suite

from turnwire_client.v1 import chat_service_pb2, event_pb2

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "clients" / "conformance"


def _cases() -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted((SUITE / "cases").glob("*.json"))]


def test_every_case_fits_the_schema_and_names_a_config() -> None:
    schema = json.loads((SUITE / "case.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    names = set()
    for case in _cases():
        jsonschema.validate(case, schema, cls=jsonschema.Draft202012Validator)
        assert (SUITE / "configs" / f"{case['config']}.json").is_file(), case["name"]
        assert case["name"] not in names, f"two cases named {case['name']}"
        names.add(case["name"])


def test_cases_cover_every_rpc_and_terminal_status() -> None:
    calls = {step["call"] for case in _cases() for step in case["steps"] if "call" in step}
    rpcs = set(chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"].methods_by_name)
    assert rpcs - calls == set()
    statuses = {
        step["expect"]["status"]
        for case in _cases()
        for step in case["steps"]
        if "status" in step.get("expect", {})
    }
    terminal = {name.removeprefix("TURN_STATUS_") for name, _ in event_pb2.TurnStatus.items()}
    terminal.discard("UNSPECIFIED")
    assert terminal - statuses == set()


_RUNNERS = {
    "python": [str(REPO / ".venv" / "bin" / "python"), "clients/conformance/python/run.py"],
    "node": ["node", "clients/conformance/node/run.mjs"],
    # The same runner over the HTTP listener (Connect, by connect-web's transport).
    "node-connect": [
        "env",
        "TURNWIRE_CONFORMANCE_PROTOCOL=connect",
        "node",
        "clients/conformance/node/run.mjs",
    ],
    "go": ["bash", "clients/conformance/go/run.sh"],
}
_GOOD = {
    "name": "good",
    "description": "Holds.",
    "config": "tiny",
    "steps": [
        {
            "call": "Chat",
            "request": {"conversationId": "g1", "message": {"parts": [{"text": {"text": "Hi"}}]}},
            "expect": {
                "events": [
                    "turn_start",
                    "step_start",
                    "text_start",
                    "text_delta+",
                    "text_end",
                    "step_finish",
                    "turn_end",
                ],
                "status": "COMPLETED",
                "text": "Hello.",
            },
        },
        {
            "call": "GetConversation",
            "request": {"conversationId": "g1"},
            "expect": {"response": {"conversation": {"messageCount": 2}}},
        },
    ],
}
# Each differs from what the sidecar does in one way a runner must notice.
_BAD = [
    {
        "call": "Chat",
        "request": {"conversationId": "b1", "message": {"parts": [{"text": {"text": "Hi"}}]}},
        "expect": {"status": "ERROR"},
    },
    {
        "call": "Chat",
        "request": {"conversationId": "b2", "message": {"parts": [{"text": {"text": "Hi"}}]}},
        "expect": {"events": ["turn_start", "turn_end"]},
    },
    {
        "call": "GetConversation",
        "request": {"conversationId": "b3-missing"},
        "expect": {"error": {"code": "NOT_FOUND", "reason": "TURN_NOT_FOUND"}},
    },
    {
        "call": "ListConversations",
        "request": {},
        "expect": {"response": {"conversations": {"$contains": [{"conversationId": "nobody"}]}}},
    },
]


@pytest.mark.parametrize("runner", sorted(_RUNNERS))
def test_a_runner_reports_failed_cases(runner: str, tmp_path: Path) -> None:
    """Each runner passes a case that holds, fails each wrong expectation, and exits 1."""
    if runner == "go" and shutil.which("go") is None:
        pytest.skip("Go not installed (make install-go)")
    if runner.startswith("node") and not (REPO / "clients" / "node" / "dist" / "index.js").is_file():
        pytest.skip("the TypeScript client is not built (make build-node)")
    (tmp_path / "configs").mkdir()
    (tmp_path / "cases").mkdir()
    config = {
        "default_model": "scripted:hi",
        "providers": {"scripted": {"scripts": {"hi": [{"text": "Hello."}]}}},
    }
    (tmp_path / "configs" / "tiny.json").write_text(json.dumps(config))
    (tmp_path / "cases" / "00-good.json").write_text(json.dumps(_GOOD))
    for index, step in enumerate(_BAD, 1):
        case = {"name": f"bad-{index}", "description": "Fails.", "config": "tiny", "steps": [step]}
        (tmp_path / "cases" / f"{index:02d}-bad.json").write_text(json.dumps(case))
    returncode, output = run_suite(_RUNNERS[runner], {"TURNWIRE_CONFORMANCE_DIR": str(tmp_path)})
    assert returncode == 1, output
    assert "ok   good" in output, output
    assert all(f"FAIL bad-{index}:" in output for index in range(1, len(_BAD) + 1)), output
    assert f"1 passed, {len(_BAD)} failed" in output, output
