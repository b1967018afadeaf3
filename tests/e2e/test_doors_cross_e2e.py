"""One turn, every door (issue 36, "the same semantics everywhere"; docs/api/http.md): a turn
started at one HTTP door is cancelled, resumed and read at another, and over gRPC.

One sidecar with the HTTP listener serves the OpenAI door (driven by the official ``openai``
Python SDK), AG-UI and the AI SDK's UI message stream (their own wire formats over HTTP here;
their own clients, ``@ag-ui/client`` and ``ai``, drive them in ``test_ag_ui_door_e2e.py`` and
``test_ai_sdk_door_e2e.py``). A response id, an AG-UI ``runId`` and a gRPC request id are the
same id; an AG-UI ``threadId``, an AI SDK chat ``id`` and a Responses ``conversation`` the same
conversation.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from support.endless import endless_step, is_prefix_of_repeats
from support.hooks import pythonpath_env
from support.http_sidecar import http_base, http_sidecar_config
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import new_token

from turnwire_client import TurnwireClient

TOKEN = new_token()
SLOW_TEXT = "".join(f"w{i} " for i in range(8))
SCRIPTS = {"echo": [{"text": "answered at every door"}], "slow": [endless_step(SLOW_TEXT, 30)]}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("doors-cross-e2e")
    config = http_sidecar_config(workdir, {TOKEN: ("ann", "tenant-x")}, SCRIPTS)
    record = workdir / "responses.txt"
    config["middleware"] = [
        {"path": "support.hooks:RecordResponses", "options": {"label": "hooked", "path": str(record)}}
    ]
    with running_sidecar(workdir, config, env=pythonpath_env()) as process:
        yield process


def base_url(sidecar: SidecarProcess) -> str:
    return http_base(sidecar)


@pytest.fixture
async def oa(sidecar: SidecarProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{base_url(sidecar)}/v1", api_key=TOKEN, max_retries=0) as client:
        yield client


HEADERS = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/event-stream"}


async def sse_data(response: httpx.Response) -> AsyncIterator[Any]:
    """The JSON of each ``data:`` line of a server-sent event stream (``[DONE]`` ends it)."""
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            if payload == "[DONE]":
                return
            yield json.loads(payload)


def run_input(thread: str, run: str, text: str, model: str) -> dict[str, Any]:
    """An AG-UI ``RunAgentInput``."""
    message = {"id": f"{run}-u", "role": "user", "content": text}
    return {"threadId": thread, "runId": run, "messages": [message], "tools": [], "context": [],
            "state": {}, "forwardedProps": {"model": model}}  # fmt: skip


async def test_an_ag_ui_run_is_cancelled_over_openai_and_read_at_every_door(
    sidecar: SidecarProcess, oa: openai.AsyncOpenAI
) -> None:
    url = base_url(sidecar)
    async with httpx.AsyncClient(timeout=30) as http:
        body = run_input("x-thread-1", "x-run-1", "talk", "scripted:slow")
        async with http.stream("POST", f"{url}/v1/ag-ui", headers=HEADERS, json=body) as response:
            assert response.status_code == 200
            events = sse_data(response)
            seen: list[dict[str, Any]] = []
            async for event in events:
                seen.append(event)
                if event["type"] == "TEXT_MESSAGE_CONTENT":
                    break  # streaming: now stop it from another door
            # A foreground run: the OpenAI door does not cancel it (as OpenAI refuses to);
            # Connect, on the same port, does.
            with pytest.raises(openai.BadRequestError):
                await oa.responses.cancel("x-run-1")
            cancel = await http.post(
                f"{url}/turnwire.v1.ChatService/CancelChat", headers=HEADERS, json={"requestId": "x-run-1"}
            )
            assert cancel.status_code == 200, cancel.text
            seen.extend([event async for event in events])
        streamed = "".join(e["delta"] for e in seen if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert seen[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR"), seen[-1]
        # The AI SDK's reconnect finds no turn running on the conversation: 204.
        resumed = await http.get(f"{url}/v1/ai-sdk/chat/x-thread-1/stream", headers=HEADERS)
        assert resumed.status_code == 204
    # OpenAI's view and gRPC's: the same turn, cancelled, its partial reply stored once.
    retrieved = await oa.responses.retrieve("x-run-1")
    assert retrieved.status == "cancelled"
    async with TurnwireClient(sidecar.target, token=TOKEN) as grpc_client:
        history = await grpc_client.get_conversation("x-thread-1")
    stored = "".join(p.text.text for p in history.messages[-1].parts if p.HasField("text"))
    assert history.messages[0].id == "x-run-1-u"
    assert is_prefix_of_repeats(stored, SLOW_TEXT) and stored == streamed, (streamed, stored)
    assert retrieved.output_text == stored


async def test_an_openai_response_is_followed_over_ag_ui_and_the_ai_sdk(
    sidecar: SidecarProcess, oa: openai.AsyncOpenAI
) -> None:
    url = base_url(sidecar)
    stream = await oa.responses.create(
        model="scripted:slow", conversation="x-thread-2", input="go", stream=True
    )
    response_id = ""
    async for event in stream:
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            break  # running and streaming
    assert response_id
    async with httpx.AsyncClient(timeout=30) as http:
        # AG-UI: a RunAgentInput naming that run re-attaches to it, from its start.
        body = run_input("x-thread-2", response_id, "go", "scripted:slow")
        async with http.stream("POST", f"{url}/v1/ag-ui", headers=HEADERS, json=body) as followed:
            ag_ui_text = ""
            async for event in sse_data(followed):
                if event["type"] == "TEXT_MESSAGE_CONTENT":
                    ag_ui_text += event["delta"]
                if len(ag_ui_text) > len(SLOW_TEXT):
                    break
        # The AI SDK's reconnect: the running turn's UI message stream, from its start.
        async with http.stream("GET", f"{url}/v1/ai-sdk/chat/x-thread-2/stream", headers=HEADERS) as resumed:
            assert resumed.status_code == 200
            assert resumed.headers["x-vercel-ai-ui-message-stream"] == "v1"
            ai_sdk_text = ""
            async for chunk in sse_data(resumed):
                if chunk["type"] == "text-delta":
                    ai_sdk_text += chunk["delta"]
                if len(ai_sdk_text) > len(SLOW_TEXT):
                    break
    assert is_prefix_of_repeats(ag_ui_text, SLOW_TEXT) and ag_ui_text.startswith(SLOW_TEXT)
    assert is_prefix_of_repeats(ai_sdk_text, SLOW_TEXT) and ai_sdk_text.startswith(SLOW_TEXT)
    await stream.close()  # the OpenAI caller leaves: its turn is cancelled (the default policy)
    async with TurnwireClient(sidecar.target, token=TOKEN) as grpc_client:
        await grpc_client.cancel_chat(response_id)


async def test_every_door_runs_the_hook_chain_and_stores_the_turn(
    sidecar: SidecarProcess, oa: openai.AsyncOpenAI
) -> None:
    """The same turn pipeline behind each door: ``on_chat_response`` of the sidecar's middleware
    (``support.hooks.RecordResponses``) runs for a turn of each, and each turn is stored."""
    url = base_url(sidecar)
    reply = await oa.responses.create(model="scripted:echo", conversation="x-hooks-oa", input="hi")
    async with httpx.AsyncClient(timeout=30) as http:
        ag_ui = await http.post(
            f"{url}/v1/ag-ui",
            headers=HEADERS,
            json=run_input("x-hooks-ag", "x-hooks-ag-r", "hi", "scripted:echo"),
        )
        message = {"id": "x-hooks-ai-u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
        ai_sdk = await http.post(
            f"{url}/v1/ai-sdk/chat",
            headers=HEADERS,
            json={
                "id": "x-hooks-ai",
                "messages": [message],
                "trigger": "submit-message",
                "model": "scripted:echo",
            },
        )
    assert ag_ui.status_code == 200 and '"RUN_FINISHED"' in ag_ui.text, ag_ui.text
    assert ai_sdk.status_code == 200 and '"type":"finish"' in ai_sdk.text.replace(" ", ""), ai_sdk.text
    async with TurnwireClient(sidecar.target, token=TOKEN) as grpc_client:
        stored = {
            c: await grpc_client.get_conversation(c) for c in ("x-hooks-oa", "x-hooks-ag", "x-hooks-ai")
        }
    for conversation, history in stored.items():
        texts = ["".join(p.text.text for p in m.parts if p.HasField("text")) for m in history.messages]
        assert texts == ["hi", "answered at every door"], (conversation, texts)
    record = Path(sidecar.workdir) / "responses.txt"
    lines = record.read_text().splitlines()
    # Hooks see ids in the store's terms: the tenant's prefix, then the id its callers use.
    hooked = {line.split()[1].removeprefix("tenant-x/") for line in lines if line.endswith(" completed")}
    ai_sdk_request = stored["x-hooks-ai"].messages[-1].id.removeprefix("tw-a-")
    assert {reply.id, "x-hooks-ag-r", ai_sdk_request} <= hooked, lines


async def test_a_door_never_gets_event_batches_whatever_its_client_sends(
    sidecar: SidecarProcess, oa: openai.AsyncOpenAI
) -> None:
    """The AG-UI, AI SDK and OpenAI doors read a turn one event a response: a client that sends
    ``turnwire-event-batches: 1`` (docs/semantics.md §10) to them gets every event all the same
    (the doors' metadata drop the header; only the Connect door passes it on)."""
    url = base_url(sidecar)
    batches = {**HEADERS, "turnwire-event-batches": "1"}
    runs = []
    async with httpx.AsyncClient(timeout=30) as http:
        for n, headers in enumerate((HEADERS, batches)):
            body = run_input(f"x-batches-{n}", f"x-batches-run-{n}", "hello", "scripted:echo")
            async with http.stream("POST", f"{url}/v1/ag-ui", headers=headers, json=body) as response:
                runs.append([event["type"] async for event in sse_data(response)])
    assert runs[0] == runs[1] and runs[1][-1] == "RUN_FINISHED", runs
    kinds = []
    for headers in ({}, {"turnwire-event-batches": "1"}):
        stream = await oa.responses.create(
            model="scripted:echo", input="hello", stream=True, extra_headers=headers
        )
        kinds.append([event.type async for event in stream])
    assert kinds[0] == kinds[1] and "response.output_text.delta" in kinds[1], kinds
