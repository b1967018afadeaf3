"""What a provider error tells the person reading it (issue 16): every error of an HTTP exchange names
the endpoint called, whatever its status and wherever it arose (error status, in the stream, a
timeout), and a body that is not JSON (a proxy's HTML page, plain text) is quoted as one short line.
The framing added to the message never changes how the error is classified."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from pydantic import TypeAdapter

from providers.helpers import collect, request
from providers.replay import ReplayServer, Reply
from turnwire.error_classes import classify_error, overflow_remedy
from turnwire.providers import ProviderError
from turnwire_server.providers import errors
from turnwire_server.providers.settings import ProviderSettings, build_provider
from turnwire_server.providers.wire import EXCERPT_CHARS, excerpt

PATHS = {
    "anthropic_provider": "/v1/messages",
    "chat_provider": "/v1/chat/completions",
    "responses_provider": "/v1/responses",
}

NGINX_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.18.0</center>\r\n"
    "</body>\r\n</html>\r\n"
)
PROXY_501 = (
    "<!DOCTYPE html><html><head><style>body { color: red; }</style>"
    "<script>var x = '<b>';</script><title>Not Implemented</title></head>"
    "<body><p>The proxy does not implement &lt;POST&gt; here.</p>"
    + "<p>padding text</p>" * 40
    + "</body></html>"
)


@pytest.mark.parametrize("adapter", sorted(PATHS))
@pytest.mark.parametrize(
    "case",
    [
        (502, NGINX_502, "502 Bad Gateway nginx/1.18.0"),
        (501, PROXY_501, "Not Implemented The proxy does not implement <POST> here. padding text"),
        (503, "upstream connect error\n  or disconnect/reset before headers.\n", "upstream connect error or"),
        (400, {"error": {"message": "bad field", "type": "invalid_request_error"}}, "bad field"),
    ],
)
async def test_an_error_status_names_the_endpoint_and_quotes_the_body_on_one_line(
    adapter: str, case: tuple[int, Any, str], replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """``case``: (status, body, what the message shows of the body)."""
    status, body, shown = case
    replay.enqueue(Reply.error(status, body))
    result = await collect(adapters[adapter], request())
    error = result.error
    assert isinstance(error, ProviderError)
    assert f": HTTP {status} (POST {replay.url}{PATHS[adapter]}): {shown}" in error.message
    assert "check base_url" not in error.message  # only for 404/405
    assert "\n" not in error.message and "<" not in error.message.replace("<POST>", "")
    assert len(error.message.split("): ", 1)[1]) <= EXCERPT_CHARS
    assert error.body == (body.strip() if isinstance(body, str) else body)  # the whole body, as received
    # The client is told what failed, not where the sidecar's provider lives (docs/security.md).
    assert (
        error.client_message
        == f"model provider error: {error.provider}: HTTP {status}: " + (error.message.split("): ", 1)[1])
    )


@pytest.mark.parametrize("adapter", sorted(PATHS))
async def test_an_error_in_the_stream_names_the_endpoint(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    body = {
        "anthropic_provider": b'event: message_start\ndata: {"type":"message_start","message":{"id":"m1",'
        b'"model":"c","usage":{"input_tokens":1,"output_tokens":1}}}\n\n'
        b'event: error\ndata: {"type":"error","error":{"type":"invalid_request_error","message":"nope"}}\n\n',
        "chat_provider": b'data: {"error":{"message":"nope","type":"invalid_request_error"}}\n\n',
        "responses_provider": b'event: error\ndata: {"type":"error","code":"invalid_request_error",'
        b'"message":"nope"}\n\n',
    }[adapter]
    replay.enqueue(Reply.sse(body))
    result = await collect(adapters[adapter], request())
    error = result.error
    assert isinstance(error, ProviderError) and error.in_stream
    assert f": error in the stream (POST {replay.url}{PATHS[adapter]}): invalid_request_error: nope" in str(
        error
    )
    assert replay.url not in error.client_message
    assert error.client_message.endswith(": error in the stream: invalid_request_error: nope")


@pytest.mark.parametrize("adapter", sorted(PATHS))
async def test_a_stream_cut_short_or_unreadable_names_the_endpoint(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    replay.enqueue(Reply.sse(b"data: not json at all\n\n"), Reply.sse(b": only a comment\n\n"))
    unreadable = await collect(adapters[adapter], request())
    cut = await collect(adapters[adapter], request())
    endpoint = f"(POST {replay.url}{PATHS[adapter]})"
    assert (
        unreadable.error is not None and f"not JSON {endpoint}: not json at all" in unreadable.error.message
    )
    assert cut.error is not None and cut.error.message.endswith(endpoint)
    assert cut.error.message.count(endpoint) == 1
    assert replay.url not in unreadable.error.client_message + cut.error.client_message


@pytest.mark.parametrize(
    ("kind", "path"), [("openai", "/v1/chat/completions"), ("anthropic", "/v1/messages")]
)
async def test_a_timeout_names_the_endpoint(kind: str, path: str) -> None:
    """An upstream that accepts the connection and never answers: the timeout names the URL called."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)  # connections wait in the backlog, never accepted, never answered
        port = listener.getsockname()[1]
        base = f"http://127.0.0.1:{port}" + ("/v1" if kind == "openai" else "")
        entries = TypeAdapter(dict[str, ProviderSettings]).validate_python(
            {
                "p": {
                    "type": kind,
                    "base_url": base,
                    "api_key_env": None,
                    "max_retries": 0,
                    "timeout_seconds": 0.2,
                }
            }
        )
        provider = build_provider("p", entries["p"], environ={})
        result = await collect(provider, request())
        await provider.aclose()
    assert isinstance(result.error, ProviderError)
    assert result.error.type == "timeout"
    assert f"p: timeout (POST http://127.0.0.1:{port}{path}):" in result.error.message
    assert f":{port}" not in result.error.client_message
    assert result.error.client_message.startswith("model provider error: p: timeout: ")


@pytest.mark.parametrize("adapter", sorted(PATHS))
async def test_a_404_tells_the_client_to_check_base_url_without_the_url(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    replay.enqueue(Reply.error(404, {"error": {"message": "no such route", "type": "not_found"}}))
    error = (await collect(adapters[adapter], request())).error
    assert isinstance(error, ProviderError)
    assert f"(POST {replay.url}{PATHS[adapter]}; check base_url): no such route" in error.message
    assert error.client_message.endswith(": HTTP 404 (check base_url): no such route")
    assert replay.url not in error.client_message


def test_excerpt() -> None:
    assert excerpt("  a\n\tb  ") == "a b"
    assert excerpt("x" * 500) == "x" * (EXCERPT_CHARS - 1) + "…"
    assert excerpt("<p>a &amp; b</p><p>a &amp; b</p><p>c</p>") == "a & b c"
    assert excerpt("<3 is not a tag") == "<3 is not a tag"
    assert excerpt("<!-- note --><div>text</div>") == "text"


def test_the_framing_is_not_read_as_the_providers_wording() -> None:
    """Gemini's input-only overflow (E17) is fixed by compaction alone; a provider called
    ``completions`` and an endpoint ending ``/chat/completions`` must not make it look like the
    output reservation is to blame ("… messages or completion")."""
    body = {
        "error": {
            "code": 400,
            "message": "The input token count exceeds the maximum number of tokens allowed (1048576).",
            "status": "INVALID_ARGUMENT",
        }
    }
    error = errors.from_status(
        "completions", 400, {}, body, endpoint="POST http://127.0.0.1:1/v1/chat/completions"
    )
    assert classify_error(error) == "context_overflow"
    assert overflow_remedy(error) == "compact"


def test_an_error_object_wrapped_in_a_list_is_read() -> None:
    """Vertex AI answers some errors with a JSON list holding the error object: its message and
    status are read, not the list's Python repr."""
    body = [{"error": {"code": 429, "message": "Resource exhausted.", "status": "RESOURCE_EXHAUSTED"}}]
    error = errors.from_status("vertex", 429, {}, body, endpoint="POST https://h/v1/x:streamGenerateContent")
    assert (
        error.message == "vertex: HTTP 429 (POST https://h/v1/x:streamGenerateContent): Resource exhausted."
    )
    assert error.type == "RESOURCE_EXHAUSTED" and error.code == "429"
    assert error.body == body


@pytest.mark.parametrize(
    ("kind", "path"), [("openai", "/v1/chat/completions"), ("anthropic", "/v1/messages")]
)
async def test_a_refused_connection_tells_the_client_without_the_address(kind: str, path: str) -> None:
    """Nothing listens at ``base_url``: the log's message names the endpoint, and the client's text
    says the connection failed without the host or port the HTTP library quotes (``Cannot connect to
    host 127.0.0.1:PORT … [Connect call failed ('127.0.0.1', PORT)]``): docs/security.md."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens on it
    base = f"http://127.0.0.1:{port}" + ("/v1" if kind == "openai" else "")
    entries = TypeAdapter(dict[str, ProviderSettings]).validate_python(
        {"p": {"type": kind, "base_url": base, "api_key_env": None, "max_retries": 0}}
    )
    provider = build_provider("p", entries["p"], environ={})
    result = await collect(provider, request())
    await provider.aclose()
    assert isinstance(result.error, ProviderError)
    assert result.error.type == "connection_error"
    assert f"p: connection error (POST http://127.0.0.1:{port}{path}):" in result.error.message
    shown = result.error.client_message
    assert str(port) not in shown and "127.0.0.1" not in shown, shown
    assert shown.startswith("model provider error: p: connection error: "), shown


def test_the_client_text_masks_the_address_in_every_form_the_libraries_quote() -> None:
    """A host name with the scheme's port (``api.internal:443``), a bracketed IPv6 address and a
    resolved socket address are ``***``; a bare name (here also the provider entry's) and a tuple
    that is no address are the message's own words and stay."""
    cases = [
        (
            "POST https://models/v1/chat/completions",
            "models: connection error (POST https://models/v1/chat/completions): Cannot connect to host "
            "models:443 ssl:True [Connect call failed ('10.0.0.7', 443)]",
            "models: connection error: Cannot connect to host *** ssl:True [Connect call failed ***]",
        ),
        (
            "POST http://[::1]:8000/v1/messages",
            "p: connection error (POST http://[::1]:8000/v1/messages): Cannot connect to host [::1]:8000 "
            "ssl:default [Connect call failed ('::1', 8000, 0, 0)]; value ('abc', 1)",
            "p: connection error: Cannot connect to host *** ssl:default [Connect call failed ***]; "
            "value ('abc', 1)",
        ),
    ]
    for endpoint, message, shown in cases:
        error = ProviderError(message, provider=message.split(":")[0])
        error.endpoint = endpoint
        assert error.client_message == f"model provider error: {shown}"
