"""A tool-calling turn on Claude through Amazon Bedrock and Google Vertex AI, and on Gemini, end to end.

A real ``turnwire serve`` has a ``bedrock``, a ``vertex`` and a ``gemini`` entry, each pointed
(``base_url``) at its own replay server in this process; credentials come the platforms' way: AWS
keys in its environment (signed with SigV4 by the SDK), Google Application Default Credentials from
a file whose token endpoint is the Vertex replay server, Gemini's API key from ``GEMINI_API_KEY``;
the metadata servers are switched off. The client asks "What's the weather in Paris?": request 1
streams a ``get_weather`` call, the sidecar runs the demo tool, request 2 streams the answer.
Bedrock's replies are AWS event-stream messages, Vertex AI's Anthropic server-sent events, Gemini's
``streamGenerateContent?alt=sse`` events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf import json_format
from providers.helpers import a_block, a_end, a_json, a_start, a_stop, a_text, anthropic_sse
from providers.replay import ReplayServer, Reply
from support import aws_event_stream as aws
from support import cloud_credentials as clouds
from support.sidecar import SidecarProcess, running_sidecar

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2

QUESTION = "What's the weather in Paris?"
CALL_ID = "toolu_01CloudE2E0000000000000"
BEDROCK_MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_MODEL = "claude-sonnet-4-5@20250929"
GEMINI_MODEL = "gemini-2.5-flash"
GEMINI_KEY = "e2e-gemini-key"


def call_step(model: str) -> list[dict[str, Any]]:
    start = a_start("msg_call", model, input_tokens=400)
    start["message"]["usage"]["cache_read_input_tokens"] = 256
    call = {"type": "tool_use", "id": CALL_ID, "name": "get_weather", "input": {}}
    text = {"type": "text", "text": ""}
    return [
        start,
        a_block(0, text),
        a_text(0, "Let me check."),
        a_stop(0),
        a_block(1, call),
        a_json(1, '{"city": "Pa'),
        a_json(1, 'ris"}'),
        a_stop(1),
        *a_end("tool_use", 30),
    ]


def answer_step(model: str, answer: str) -> list[dict[str, Any]]:
    text = {"type": "text", "text": ""}
    return [
        a_start("msg_answer", model),
        a_block(0, text),
        a_text(0, answer),
        a_stop(0),
        *a_end("end_turn", 12),
    ]


def gemini_step(parts: list[dict[str, Any]], finish: str, usage: dict[str, int]) -> Reply:
    """One ``streamGenerateContent`` response: the parts, then the finish reason and usage."""
    candidate = {"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}
    body = {
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": GEMINI_MODEL,
        "responseId": "r",
    }
    return Reply(
        headers={"content-type": "text/event-stream"},
        chunks=[b"data: %s\r\n\r\n" % json.dumps(body).encode()],
    )


@dataclass
class Clouds:
    sidecar: SidecarProcess
    bedrock: ReplayServer
    vertex: ReplayServer
    gemini: ReplayServer


@pytest.fixture(scope="module")
def clouds_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clouds]:
    bedrock, vertex, gemini = ReplayServer().start(), ReplayServer().start(), ReplayServer().start()
    folder = tmp_path_factory.mktemp("cloud-providers-e2e")
    common = {"max_retries": 0, "timeout_seconds": 10}
    config = {
        "default_model": f"bedrock:{BEDROCK_MODEL}",
        "providers": {
            "bedrock": {"type": "bedrock", "region": "eu-west-1", "base_url": bedrock.url, **common},
            "vertex": {
                "type": "vertex",
                "project": "e2e-project",
                "location": "europe-west1",
                "base_url": f"{vertex.url}/v1",
                **common,
            },
            "gemini": {"type": "gemini", "base_url": gemini.url, **common},
        },
    }
    # The test's AWS keys come first in the AWS chain and the entries name region and project, so
    # the host's own AWS and Google variables change nothing (an empty AWS_BEARER_TOKEN_BEDROCK
    # would: the SDK sends it as an empty bearer token, so none is set here).
    try:
        env = {**clouds.cloud_environment(folder, vertex.url), "GEMINI_API_KEY": GEMINI_KEY}
        with running_sidecar(folder, config, env) as sidecar:
            yield Clouds(sidecar, bedrock, vertex, gemini)
    finally:
        for server in (bedrock, vertex, gemini):
            server.stop()


async def weather_turn(sidecar: SidecarProcess, conversation: str, model: str) -> Any:
    async with TurnwireClient(sidecar.target) as client:
        return await collect(client.chat(conversation, QUESTION, model=model))


def check_turn(result: Any, log: str, call_id: str = CALL_ID) -> str:
    """The turn completed with one ``get_weather`` call run by the sidecar; returns the answer."""
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, log)
    (call,) = result.tool_calls
    assert (call.tool_call_id, call.tool_name, call.input) == (call_id, "get_weather", {"city": "Paris"})
    assert call.state == "output-available" and call.output["city"] == "Paris"
    finishes = [e.step_finish for e in result.events if e.WhichOneof("event") == "step_finish"]
    assert [f.finish_reason for f in finishes] == [
        event_pb2.FINISH_REASON_TOOL_CALLS,
        event_pb2.FINISH_REASON_STOP,
    ]
    first = finishes[0].usage
    assert (first.input_tokens, first.cached_input_tokens, first.output_tokens) == (656, 256, 30)
    ends = [e.turn_end for e in result.events if e.WhichOneof("event") == "turn_end"]
    assert ends[0].HasField("cost"), "priced from genai-prices under the platform's own list"
    return str(result.text)


def check_second_request(body: dict[str, Any]) -> None:
    """Request 2 carries the call and its result as the Messages API has them."""
    assistant, results = body["messages"][1:]
    assert assistant["content"][-1] == {
        "type": "tool_use",
        "id": CALL_ID,
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    (result,) = results["content"]
    assert (result["type"], result["tool_use_id"]) == ("tool_result", CALL_ID)
    assert json.loads(result["content"])["city"] == "Paris"


async def test_a_tool_call_turn_on_bedrock(clouds_sidecar: Clouds) -> None:
    replay = clouds_sidecar.bedrock
    answer = "Sunny in Paris."
    for events in (call_step(BEDROCK_MODEL), answer_step(BEDROCK_MODEL, answer)):
        replay.enqueue(Reply(headers={"content-type": aws.CONTENT_TYPE}, chunks=aws.chunks(events)))
    result = await weather_turn(clouds_sidecar.sidecar, "bedrock-weather", f"bedrock:{BEDROCK_MODEL}")
    assert check_turn(result, clouds_sidecar.sidecar.log_text()).endswith(answer)
    path = f"/model/{BEDROCK_MODEL}/invoke-with-response-stream"
    assert [r.path for r in replay.requests] == [path, path]
    for sent in replay.requests:
        auth = sent.headers["authorization"]
        assert auth.startswith(f"AWS4-HMAC-SHA256 Credential={clouds.AWS_ACCESS_KEY_ID}/")
        assert "/eu-west-1/bedrock/aws4_request" in auth
    check_second_request(replay.requests[1].json)
    log = clouds_sidecar.sidecar.log_text()
    assert "wJalrXUtnFEMI" not in log and clouds.AWS_ACCESS_KEY_ID not in log


async def test_a_tool_call_turn_on_vertex(clouds_sidecar: Clouds) -> None:
    replay = clouds_sidecar.vertex
    answer = "Sunny in Paris, says Vertex."
    replay.enqueue(
        Reply.error(200, clouds.TOKEN_REPLY),
        Reply.sse(anthropic_sse(*call_step(VERTEX_MODEL))),
        Reply.sse(anthropic_sse(*answer_step(VERTEX_MODEL, answer))),
    )
    result = await weather_turn(clouds_sidecar.sidecar, "vertex-weather", f"vertex:{VERTEX_MODEL}")
    assert check_turn(result, clouds_sidecar.sidecar.log_text()).endswith(answer)
    token, *steps = replay.requests
    assert token.path == "/token"
    model_path = f"/v1/projects/e2e-project/locations/europe-west1/publishers/anthropic/models/{VERTEX_MODEL}"
    path = f"{model_path}:streamRawPredict"
    assert [r.path for r in steps] == [path, path]
    assert {r.headers["authorization"] for r in steps} == {f"Bearer {clouds.GOOGLE_ACCESS_TOKEN}"}
    check_second_request(steps[1].json)
    assert clouds.GOOGLE_ACCESS_TOKEN not in clouds_sidecar.sidecar.log_text()
    assert json_format.MessageToDict(result.events[0].turn_start)["model"] == f"vertex:{VERTEX_MODEL}"


async def test_a_tool_call_turn_on_gemini(clouds_sidecar: Clouds) -> None:
    replay = clouds_sidecar.gemini
    answer = "Sunny in Paris, says Gemini."
    call = {
        "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
        "thoughtSignature": "c2lnbmVk",
    }
    usage = {"promptTokenCount": 656, "cachedContentTokenCount": 256, "candidatesTokenCount": 30}
    replay.enqueue(
        gemini_step([{"text": "Let me check."}, call], "STOP", usage),
        gemini_step([{"text": answer}], "STOP", {"promptTokenCount": 700, "candidatesTokenCount": 12}),
    )
    result = await weather_turn(clouds_sidecar.sidecar, "gemini-weather", f"gemini:{GEMINI_MODEL}")
    assert check_turn(result, clouds_sidecar.sidecar.log_text(), "s0-call0").endswith(answer)
    path = f"/models/{GEMINI_MODEL}:streamGenerateContent?alt=sse"
    assert all(r.path.endswith(path) for r in replay.requests) and len(replay.requests) == 2
    assert {r.headers["x-goog-api-key"] for r in replay.requests} == {GEMINI_KEY}
    model, results = replay.requests[1].json["contents"][1:]
    assert model["parts"][-1] == {
        "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
        "thoughtSignature": "c2lnbmVk",
    }
    (response,) = results["parts"]
    assert response["functionResponse"]["name"] == "get_weather"
    assert response["functionResponse"]["response"]["output"]["city"] == "Paris"
    assert GEMINI_KEY not in clouds_sidecar.sidecar.log_text()
