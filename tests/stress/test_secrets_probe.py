"""Probe: a provider that quotes the API key in every shape an error can take never gets it to a
client, the store or the log (issue 32, items 1 and 2).

A real ``turnwire serve`` calls a replay server through the official ``openai`` SDK; each round
the replay answers one error shape quoting the key: a 401 JSON body, a proxy's HTML page, an error
event inside a 200 stream, a 400 whose ``param`` holds it. Size: ``TURNWIRE_STRESS_SCALE``
(default 1: 20 rounds, what CI runs; ``make stress``: more).
"""

from __future__ import annotations

import itertools
import os

import orjson
from providers.replay import ReplayServer, Reply
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2

SCALE = max(1, int(os.environ.get("TURNWIRE_STRESS_SCALE", "1")))
KEY = "sk-proj-Qw3ErT7yUi9OpAs2DfGh5JkL8ZxCv1BnM4Lp0Zq"


def _shapes() -> list[Reply]:
    sse_error = b"data: " + orjson.dumps(
        {"error": {"message": f"bad key {KEY}", "type": "invalid_request_error"}}
    )
    return [
        Reply.error(
            401, {"error": {"message": f"Incorrect API key provided: {KEY}.", "code": "invalid_api_key"}}
        ),
        Reply.error(502, f"<html><body>upstream refused Authorization: Bearer {KEY}</body></html>"),
        Reply.sse(sse_error + b"\n\n"),
        Reply.error(
            400,
            {
                "error": {
                    "message": "invalid header",
                    "param": f"x-api-key={KEY}",
                    "type": "invalid_request_error",
                }
            },
        ),
    ]


async def test_no_shape_of_a_quoted_key_reaches_a_client(sidecar_factory: SidecarFactory) -> None:
    replay = ReplayServer().start()
    try:
        entry = {
            "type": "openai",
            "base_url": f"{replay.url}/v1",
            "api_key_env": "PROBE_KEY",
            "max_retries": 0,
        }
        sidecar = await sidecar_factory(
            config={"default_model": "probe:m", "providers": {"probe": entry}},
            env={"PROBE_KEY": KEY, "TURNWIRE_LOG_LEVEL": "debug"},
        ).start()
        rounds = 20 * SCALE
        async with TurnwireClient(sidecar.target) as client:
            for index, reply in zip(range(rounds), itertools.cycle(_shapes()), strict=False):
                replay.enqueue(reply)
                result = await collect(client.chat(f"probe-{index % 4}", "hello"))
                assert result.status == event_pb2.TURN_STATUS_ERROR, result
                assert KEY not in str(result.error), result.error
            for conversation in range(4):
                assert KEY not in str(await client.get_conversation(f"probe-{conversation}"))
        await sidecar.terminate()
    finally:
        replay.stop()
    assert KEY not in sidecar.log_text()
