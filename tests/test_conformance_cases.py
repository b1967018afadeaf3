"""The conformance suite's case files (clients/conformance): valid against case.schema.json, each
naming an existing config, and together covering every ChatService RPC and every terminal
TurnStatus (issue 15). The runners themselves run in `make conformance` (part of `make test`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from turnwire_client.v1 import chat_service_pb2, event_pb2

SUITE = Path(__file__).resolve().parent.parent / "clients" / "conformance"


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
