// A chat page on the Turnwire sidecar's HTTP listener: ChatService.Chat over the Connect
// protocol with @connectrpc/connect-web and the TypeScript client's generated code. The text
// streams in as it comes; tool calls show with their input and output.
//
// Where to call and with what token come from the page's query (?api=…&token=…&conversation=…)
// so the browser test can point it at a test sidecar; an application would configure them.
import { createClient, type Interceptor } from "@connectrpc/connect";
import {
  createConnectTransport,
  createGrpcWebTransport,
} from "@connectrpc/connect-web";
import { createRegistry } from "@bufbuild/protobuf";
import { file_google_rpc_error_details } from "@turnwire/client/gen/google/rpc/error_details_pb";
import { ChatService } from "@turnwire/client/gen/turnwire/v1/chat_service_pb";

const query = new URLSearchParams(location.search);
const api = query.get("api") ?? "http://127.0.0.1:8080";
const token = query.get("token");
const conversationId = query.get("conversation") ?? `web-${Date.now()}`;

// The bearer token travels in the authorization header (never a cookie).
const bearer: Interceptor = (next) => async (request) => {
  if (token) request.header.set("authorization", `Bearer ${token}`);
  return next(request);
};
// JSON (connect-web's default) needs the types of the google.rpc error details that a failed
// turn's TurnEnd.error carries in google.protobuf.Any; useBinaryFormat: true needs none.
const registry = createRegistry(file_google_rpc_error_details);
const options = {
  baseUrl: api,
  interceptors: [bearer],
  jsonOptions: { registry },
};
const transport =
  query.get("protocol") === "grpc-web"
    ? createGrpcWebTransport(options)
    : createConnectTransport(options);
const chat = createClient(ChatService, transport);

const byId = <T extends HTMLElement>(id: string): T =>
  document.getElementById(id) as T;
const transcript = byId<HTMLDivElement>("transcript");
const state = byId<HTMLParagraphElement>("state");
byId("api").textContent = api;
byId("conversation").textContent = conversationId;

function line(className: string, text: string): HTMLDivElement {
  const element = document.createElement("div");
  element.className = className;
  element.textContent = text;
  transcript.append(element);
  return element;
}

async function ask(text: string): Promise<void> {
  line("user", `You: ${text}`);
  let reply: HTMLDivElement | null = null;
  const tools = new Map<string, HTMLDivElement>();
  state.textContent = "streaming";
  try {
    const turn = chat.chat({
      conversationId,
      message: { parts: [{ kind: { case: "text", value: { text } } }] },
    });
    for await (const { event } of turn) {
      const kind = event?.event;
      if (!kind) continue;
      switch (kind.case) {
        case "textDelta":
          reply ??= line("assistant", "");
          reply.textContent += kind.value.delta;
          // How many pieces the text came in: the browser test checks it streamed.
          transcript.dataset.deltas = String(
            Number(transcript.dataset.deltas ?? 0) + 1,
          );
          break;
        case "toolInputAvailable":
          reply = null; // the text after a tool call is a new paragraph
          tools.set(
            kind.value.toolCallId,
            line(
              "tool",
              `tool ${kind.value.toolName}(${kind.value.inputJson})`,
            ),
          );
          break;
        case "toolOutputAvailable": {
          const tool = tools.get(kind.value.toolCallId);
          if (tool) tool.textContent += ` → ${kind.value.outputJson}`;
          break;
        }
        case "turnEnd":
          state.textContent = `turn ended: ${kind.value.status === 1 ? "completed" : `status ${kind.value.status}`}`;
          break;
      }
    }
  } catch (error) {
    state.textContent = `error: ${error instanceof Error ? error.message : String(error)}`;
  }
}

byId<HTMLFormElement>("ask").addEventListener("submit", (submitted) => {
  submitted.preventDefault();
  const input = byId<HTMLInputElement>("text");
  const text = input.value.trim();
  input.value = "";
  if (text) void ask(text);
});
