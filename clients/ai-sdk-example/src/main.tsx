// A chat page on the Turnwire sidecar's AI SDK door (docs/api/ai-sdk.md): the AI SDK's own
// `useChat` (@ai-sdk/react) with its `DefaultChatTransport` pointed at POST /v1/ai-sdk/chat. The
// text streams in as it comes; the sidecar's tools (the demo calculator) show with their input and
// output; `get_location` is a client tool: the page lists it in the transport's `body.tools`, the
// turn ends waiting for it, the user shares a location with a button (`addToolOutput`) and the
// Chat sends it back on its own (`sendAutomaticallyWhen`), so the model's answer streams into the
// same message.
//
// Where to call, with what token and model come from the page's query
// (?api=…&token=…&conversation=…&model=…) so the browser test can point it at a test sidecar; an
// application would configure them. The model field is sent with each request (`body.model`;
// empty: the sidecar's default model).
import { useChat } from "@ai-sdk/react";
import {
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithToolCalls,
  type UIMessage,
} from "ai";
import { useEffect, useRef, useState, type FormEvent } from "react";
import { createRoot } from "react-dom/client";

const query = new URLSearchParams(location.search);
const api = query.get("api") ?? "http://127.0.0.1:8080";
const token = query.get("token");
const conversationId = query.get("conversation") ?? `ai-sdk-${Date.now()}`;

// A client tool, declared to the sidecar in the request body (`body.tools`): its calls reach
// the page, which answers them with addToolOutput.
const CLIENT_TOOLS = {
  get_location: {
    description:
      "The user's location, shared from their browser when they agree",
    inputSchema: {
      type: "object",
      properties: { precision: { type: "string", enum: ["city", "exact"] } },
    },
  },
};
// What the page answers when the user shares; a real page would ask navigator.geolocation.
const SHARED_LOCATION = { city: "Paris", country: "FR" };

type Part = UIMessage["parts"][number];
type ToolPart = Extract<Part, { toolCallId: string }>;

const isTool = (part: Part): part is ToolPart => "toolCallId" in part;
const toolName = (part: ToolPart): string =>
  part.type === "dynamic-tool"
    ? part.toolName
    : part.type.slice("tool-".length);
const json = (value: unknown): string => JSON.stringify(value ?? null);
const textOf = (message: UIMessage | undefined): string =>
  (message?.parts ?? [])
    .map((part) => (part.type === "text" ? part.text : ""))
    .join("");

function Tool({
  part,
  share,
}: {
  part: ToolPart;
  share: (part: ToolPart) => void;
}) {
  const name = toolName(part);
  const waiting = name === "get_location" && part.state === "input-available";
  return (
    <div className="tool" data-tool={name} data-state={part.state}>
      tool {name}({json(part.input)})
      {part.state === "output-available" && <> → {json(part.output)}</>}
      {part.state === "output-error" && <> failed: {part.errorText}</>}
      {waiting && (
        <>
          {" "}
          <button id="share-location" type="button" onClick={() => share(part)}>
            Share my location
          </button>
        </>
      )}
    </div>
  );
}

function App() {
  const [model, setModel] = useState(query.get("model") ?? "");
  const modelRef = useRef(model);
  modelRef.current = model;
  const [transport] = useState(
    () =>
      new DefaultChatTransport({
        api: `${api}/v1/ai-sdk/chat`,
        // the bearer token travels in the authorization header (never a cookie)
        headers: token ? { authorization: `Bearer ${token}` } : undefined,
        // read at each request, the automatic one after addToolOutput included
        body: () => ({
          model: modelRef.current || undefined,
          tools: CLIENT_TOOLS,
        }),
      }),
  );
  const { messages, sendMessage, addToolOutput, status, error } = useChat({
    id: conversationId,
    transport,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls,
  });
  const [input, setInput] = useState("");

  // How many times the reply's text grew on the page: more than once when it streamed in pieces.
  // Kept in the transcript's data-text-updates for the browser test.
  const transcript = useRef<HTMLDivElement>(null);
  const updates = useRef(0);
  const replyLength = textOf(
    messages.findLast((m) => m.role === "assistant"),
  ).length;
  useEffect(() => {
    if (replyLength > 0) updates.current += 1;
    transcript.current!.dataset.textUpdates = String(updates.current);
  }, [replyLength]);

  const submit = (event: FormEvent) => {
    event.preventDefault();
    if (!input.trim()) return;
    void sendMessage({ text: input });
    setInput("");
  };
  const share = (part: ToolPart) =>
    void addToolOutput({
      tool: "get_location",
      toolCallId: part.toolCallId,
      output: SHARED_LOCATION,
    });

  return (
    <>
      <p className="status">
        AI SDK <code>useChat</code> to <code>{api}/v1/ai-sdk/chat</code>;
        conversation <code>{conversationId}</code>; model{" "}
        <input
          id="model"
          value={model}
          placeholder="the sidecar's default"
          onChange={(e) => setModel(e.target.value)}
        />
      </p>
      <div id="transcript" ref={transcript}>
        {messages.map((message) => (
          <div
            key={message.id}
            className={message.role}
            data-role={message.role}
          >
            {message.parts.map((part, index) =>
              part.type === "text" ? (
                <p key={index} className="text">
                  {part.text}
                </p>
              ) : isTool(part) ? (
                <Tool key={part.toolCallId} part={part} share={share} />
              ) : null,
            )}
          </div>
        ))}
      </div>
      <form onSubmit={submit}>
        <input
          id="text"
          autoComplete="off"
          value={input}
          onChange={(e) => setInput(e.target.value)}
          placeholder="Ask something, e.g. What is 6 * 7, and where am I?"
        />
        <button
          id="send"
          type="submit"
          disabled={status !== "ready" && status !== "error"}
        >
          Send
        </button>
      </form>
      <p className="status" id="state">
        {status}
      </p>
      {error && (
        <p className="error" id="error">
          {error.message}
        </p>
      )}
    </>
  );
}

createRoot(document.getElementById("root")!).render(<App />);
