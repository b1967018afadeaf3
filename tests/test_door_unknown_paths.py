"""A path or method under a door's prefix that the door does not serve answers 404 in that door's
own error shape (server/turnwire_server/http/doors.py, docs/api/ai-sdk.md#errors,
docs/api/ag-ui.md#errors), over the listener's real application in process: the AI SDK door's
plain-text message (what its transport raises as the chat's ``Error``), AG-UI's ``RUN_ERROR``
JSON, and OpenAI's error body for the other ``/v1/`` paths. Before, every one of them answered
OpenAI's JSON body (``{"error": {…, "code": "unknown_url"}}``), which the AI SDK's ``Chat`` shows
as raw JSON and AG-UI's ``HttpAgent`` does not read as a run error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest

from turnwire_server.http.doors import DoorContext, build_app
from turnwire_server.http.server import DOORS
from turnwire_server.http.settings import CorsSettings


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    # No call reaches the servicer: an unserved path is answered before any RPC.
    context = DoorContext(calls=None, services=[], read_max_bytes=1 << 20)  # type: ignore[arg-type]
    app = build_app(context, DOORS, CorsSettings())
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://door") as client:
        yield client


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/ai-sdk/chats"),
        ("GET", "/v1/ai-sdk"),
        ("GET", "/v1/ai-sdk/chat"),
        ("DELETE", "/v1/ai-sdk/x/y"),
    ],
)
async def test_the_ai_sdk_door_answers_its_unknown_paths_in_plain_text(
    http: httpx2.AsyncClient, method: str, path: str
) -> None:
    answer = await http.request(method, path)
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("text/plain")
    assert answer.text.startswith(f"{method} {path} is not served by this sidecar; its AI SDK door serves")
    assert "POST /v1/ai-sdk/chat" in answer.text


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/ag-ui"), ("POST", "/v1/ag-ui/runs")])
async def test_the_ag_ui_door_answers_its_unknown_paths_as_a_run_error(
    http: httpx2.AsyncClient, method: str, path: str
) -> None:
    answer = await http.request(method, path)
    assert answer.status_code == 404
    body = answer.json()
    assert (body["type"], body["code"]) == ("RUN_ERROR", "unknown_url")
    assert (
        body["message"].startswith(f"{method} {path} is not served") and "POST /v1/ag-ui" in body["message"]
    )


async def test_other_v1_paths_keep_openais_error_body(http: httpx2.AsyncClient) -> None:
    for path in ("/v1/models", "/v1/ai-sdkx", "/v1/responses/x/input_items"):
        answer = await http.get(path)
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "unknown_url", path
