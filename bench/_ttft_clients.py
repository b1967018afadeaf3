"""``ttft.py``'s processes and clients: the local upstream, a sidecar config, the gRPC ``Chat``
client and the bare official SDK client (shared with ``_ttft_budget.py`` and ``ttft_profile.py``)."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import cast

import anthropic
import grpc
import openai
from _common import CLIENT_OPTIONS, PYTHON, ServerProcess, free_port
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2

BENCH = Path(__file__).resolve().parent
ANTHROPIC_MAX_TOKENS = 1024
QUESTION = "Tell me about the fox."
ANSWER = "The quick brown fox jumps over the lazy dog while the model streams its answer."


def new_conversation_id() -> str:
    """A conversation id nobody used: a new conversation per request."""
    return f"ttft-new-{uuid.uuid4().hex}"


# ----------------------------------------------------------------------------- processes


class Upstream:
    """``_upstream.py`` in its own process."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [PYTHON, str(BENCH / "_upstream.py")], stdout=subprocess.PIPE, text=True, cwd=BENCH
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        if not self.url:
            raise RuntimeError("the upstream did not start")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(5)


def upstream_sidecar(
    home: Path, upstream: str, model: str, extra: str = "", name: str = "turnwire"
) -> tuple[ServerProcess, Path]:
    """A bench sidecar on the local upstream, not yet started: both providers at ``upstream`` (no
    key, no retries), SQLite in ``home``, demo tools off, 1 s shutdown grace; ``extra`` is more
    top-level YAML (whole sections, each line ending in a newline). Returns the process and its
    config file (``home/turnwire.yaml``). Shared by ``ttft.py``, ``memory_soak.py`` and
    ``http_door.py``, so their arms run the same sidecar."""
    port = free_port()
    config = f"""\
listen: 127.0.0.1:{port}
default_model: {model}
logging: {{level: warning}}
store:
  url: sqlite:///{home / "turnwire.db"}
providers:
  openai:
    type: openai
    base_url: {upstream}/v1
    api_key_env: null
    max_retries: 0
  anthropic:
    type: anthropic
    base_url: {upstream}
    api_key_env: null
    max_retries: 0
tools:
  demo: false
limits:
  shutdown_grace_seconds: 1
{extra}"""
    path = home / "turnwire.yaml"
    path.write_text(config)
    argv = [PYTHON, "-m", "turnwire_server", "serve", "--config", str(path)]
    return ServerProcess(argv, port, home, name), path


def sidecar(workdir: Path, upstream: str, middlewares: int) -> ServerProcess:
    """``ttft.py``'s sidecar with ``middlewares`` no-op every-hook middlewares (SQLite in its own
    directory), not yet started."""
    home = workdir / f"sidecar-{middlewares}"
    home.mkdir()
    chain = "".join("  - path: _ttft_middlewares:EveryHookNoop\n" for _ in range(middlewares))
    extra = f"middleware:{' []' if not middlewares else ''}\n{chain}"
    return upstream_sidecar(home, upstream, "openai:burst-4", extra, f"turnwire-mw{middlewares}")[0]


# ----------------------------------------------------------------------------- clients


def text_message(role: message_pb2.Role.ValueType, text: str, message_id: str = "") -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=role)
    message.parts.add().text.text = text
    return message


class SidecarClient:
    """Chat calls on one channel; each returns its time to first token (s) and deltas received."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS)
        self.stub = chat_service_pb2_grpc.ChatServiceStub(self.channel)
        # Event batches, as the Python client reads them (docs/semantics.md §10); an older
        # sidecar (a --base arm) ignores the header and sends an event a message.
        self.metadata = (("turnwire-event-batches", "1"),)

    async def seed(self, conversation_id: str, turns: int) -> None:
        """``turns`` prior user/assistant pairs, one AddMessages call."""
        if not turns:
            return
        messages = []
        for i in range(turns):
            messages.append(text_message(message_pb2.ROLE_USER, f"{QUESTION} ({i})", f"seed-u{i}"))
            messages.append(text_message(message_pb2.ROLE_ASSISTANT, ANSWER, f"seed-a{i}"))
        await self.stub.AddMessages(
            chat_service_pb2.AddMessagesRequest(
                conversation_id=conversation_id, messages=messages, allow_missing=True
            )
        )

    async def turn(
        self, conversation_id: str, model: str, stop_after_first: bool = False
    ) -> tuple[float, int]:
        """Time to first token and the upstream deltas received: words of text, since the upstream
        sends one word per delta and the sidecar merges deltas its writer could not keep up with."""
        request = chat_service_pb2.ChatRequest(
            conversation_id=conversation_id,
            message=text_message(message_pb2.ROLE_USER, QUESTION),
            model=model,
        )
        start = time.perf_counter()
        first = 0.0
        text: list[str] = []
        call = self.stub.Chat(request, metadata=self.metadata)
        async for response in call:
            for event in (response.event, *response.more_events):
                if event.WhichOneof("event") == "text_delta":
                    if not text:
                        first = time.perf_counter() - start
                        if stop_after_first:
                            return first, 1
                    text.append(event.text_delta.delta)
        if not text:
            raise RuntimeError(f"no text from the sidecar for {model}")
        return first, len("".join(text).split())

    async def close(self) -> None:
        await self.channel.close()


class BareClient:
    """The official SDK calling the upstream directly, with the same history as the sidecar."""

    def __init__(self, api: str, upstream: str) -> None:
        self.api = api
        if api == "openai":
            self.openai = openai.AsyncOpenAI(base_url=f"{upstream}/v1", api_key="bench", max_retries=0)
        else:
            self.anthropic = anthropic.AsyncAnthropic(base_url=upstream, api_key="bench", max_retries=0)

    @staticmethod
    def history(turns: int) -> list[MessageParam]:
        out: list[MessageParam] = []
        for i in range(turns):
            out.append({"role": "user", "content": f"{QUESTION} ({i})"})
            out.append({"role": "assistant", "content": ANSWER})
        return out

    async def turn(self, history: list[MessageParam], model: str) -> tuple[float, int]:
        """One turn on ``history`` (appended to, as an application keeps its transcript)."""
        history.append({"role": "user", "content": QUESTION})
        start = time.perf_counter()
        first = 0.0
        text: list[str] = []
        if self.api == "openai":
            stream = await self.openai.chat.completions.create(
                model=model,
                # The same role/content dicts: each SDK types them as its own TypedDicts.
                messages=cast("list[ChatCompletionMessageParam]", history),
                stream=True,
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    if not text:
                        first = time.perf_counter() - start
                    text.append(chunk.choices[0].delta.content)
        else:
            events = await self.anthropic.messages.create(
                model=model,
                max_tokens=ANTHROPIC_MAX_TOKENS,
                messages=history,
                stream=True,
            )
            async for event in events:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    if not text:
                        first = time.perf_counter() - start
                    text.append(event.delta.text)
        history.append({"role": "assistant", "content": "".join(text)})
        return first, len(text)

    async def close(self) -> None:
        await (self.openai if self.api == "openai" else self.anthropic).close()
