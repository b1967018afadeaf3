// The Vercel AI SDK (`ai` on npm, 6.x, unmodified: the newest major that runs on Node.js 20; 7.x
// needs Node.js 22) against the sidecar's AI SDK door. Run by tests/e2e/test_ai_sdk_door_e2e.py:
//
//   node tests/support/ai_sdk_node.mjs API TOKEN SCENARIO CHAT_ID [JSON_OPTIONS]
//
// API is the door's URL (http://HOST:PORT/v1/ai-sdk/chat). Each scenario drives the AI SDK's own
// `DefaultChatTransport` (which validates every chunk against the SDK's chunk schema) through a
// `Chat`: the AI SDK's `AbstractChat` with an in-memory state, as @ai-sdk/react's `Chat` is with
// React's. It prints one JSON object of what it saw; the Python test asserts on it.

import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
} from 'ai';

const [api, token, scenario, chatId, optionsText] = process.argv.slice(2);
const options = JSON.parse(optionsText ?? '{}');

let latest; // the scenario's chat, shown when the scenario fails

class Chat extends AbstractChat {
  constructor(init) {
    const state = {
      status: 'ready',
      error: undefined,
      messages: [],
      pushMessage(message) { this.messages = [...this.messages, message]; },
      popMessage() { this.messages = this.messages.slice(0, -1); },
      replaceMessage(index, message) { this.messages = this.messages.with(index, message); },
      snapshot: (thing) => structuredClone(thing),
    };
    super({ ...init, state });
    latest = this;
  }

  get messages() { return this.state.messages; }
}

// The transport's body is read at each request: a scenario that changes `model` (the scripted
// model of a continuation) changes the next request's, the automatic ones included.
let model = options.body?.model;

function transport(body = {}) {
  return new DefaultChatTransport({
    api,
    headers: { authorization: `Bearer ${token}` },
    body: () => ({ ...body, model }),
  });
}

async function waitFor(what, condition, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

function seen(chat, extra = {}) {
  return { status: chat.status, error: chat.error?.message ?? null, messages: chat.messages, ...extra };
}

// Resume the chat's stream; once its last message holds more than `length` characters of text,
// say RESUMED on stderr; then read it to its end.
async function follow(chat, length) {
  const resuming = chat.resumeStream();
  await waitFor('the resumed stream', () => chat.messages.length > 0 && text(chat.messages.at(-1)).length > length);
  process.stderr.write('RESUMED\n');
  await resuming;
}

const text = (message) => message.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');

const scenarios = {
  // The chunks of one POST, read with the transport itself (validated by the SDK's schema).
  async chunks() {
    const stream = await transport(options.body).sendMessages({
      chatId,
      trigger: 'submit-message',
      messageId: undefined,
      messages: [{ id: options.messageId ?? `u-${Date.now()}`, role: 'user', parts: [{ type: 'text', text: 'hi' }] }],
      abortSignal: undefined,
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    return { chunks };
  },

  // One user message through the Chat, to the end of its turn.
  async send() {
    const chat = new Chat({ id: chatId, transport: transport(options.body) });
    await chat.sendMessage({ text: options.text ?? 'hi' });
    return seen(chat);
  },

  // A message, then chat.regenerate() under options.followUpModel: the same user message sent
  // again (trigger regenerate-message).
  async regenerate() {
    const chat = new Chat({ id: chatId, transport: transport(options.body) });
    await chat.sendMessage({ text: 'hi' });
    const first = seen(chat);
    model = options.followUpModel;
    chat.clearError();
    await chat.regenerate();
    return seen(chat, { first });
  },

  // A client tool: onToolCall answers get_location with addToolOutput; the Chat sends it back
  // on its own (sendAutomaticallyWhen), and the continuation streams into the same message.
  async clientTool() {
    const chat = new Chat({
      id: chatId,
      transport: transport(options.body),
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls,
      onToolCall: async ({ toolCall }) => {
        if (toolCall.toolName !== 'get_location') return;
        model = options.followUpModel;
        // not awaited: the Chat applies it once the stream is read (the AI SDK's own advice)
        chat.addToolOutput({ tool: 'get_location', toolCallId: toolCall.toolCallId, output: { city: 'Paris', input: toolCall.input } });
      },
    });
    await chat.sendMessage({ text: 'Where am I?' });
    await waitFor('the continuation', () => chat.status === 'ready' && text(chat.messages.at(-1)).includes(options.expect));
    return seen(chat);
  },

  // A tool that needs approval: answered with addToolApprovalResponse and sent back on its own.
  async approval() {
    const chat = new Chat({
      id: chatId,
      transport: transport(options.body),
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    });
    await chat.sendMessage({ text: 'The weather in Paris?' });
    const asked = chat.messages.at(-1).parts.find((p) => p.state === 'approval-requested');
    const requested = structuredClone(asked);
    model = options.followUpModel;
    await chat.addToolApprovalResponse({ id: asked.approval.id, approved: options.approved, reason: options.approved ? undefined : 'not now' });
    await waitFor('the continuation', () => chat.status === 'ready' && text(chat.messages.at(-1)).includes(options.expect));
    return seen(chat, { requested });
  },

  // One step calling a client tool and a tool that needs approval: the output is added at once,
  // the approval after; the Chat sends both in one request once both are answered.
  async mixed() {
    const chat = new Chat({
      id: chatId,
      transport: transport(options.body),
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
      onToolCall: async ({ toolCall }) => {
        if (toolCall.toolName !== 'get_location') return;
        chat.addToolOutput({ tool: 'get_location', toolCallId: toolCall.toolCallId, output: { city: 'Paris' } });
      },
    });
    await chat.sendMessage({ text: 'Where am I, and the weather there?' });
    await waitFor('the approval request', () => chat.status === 'ready' && chat.messages.at(-1).parts.some((p) => p.state === 'approval-requested'));
    const asked = chat.messages.at(-1).parts.find((p) => p.state === 'approval-requested');
    model = options.followUpModel;
    await chat.addToolApprovalResponse({ id: asked.approval.id, approved: true });
    await waitFor('the continuation', () => chat.status === 'ready' && text(chat.messages.at(-1)).includes(options.expect));
    return seen(chat);
  },

  // A turn left after its first text (the fetch aborted: the connection closes), then
  // reconnectToStream (GET .../{id}/stream) replays it from its start; RESUMED on stderr once the
  // replay has passed what the first stream showed (the test then ends the turn).
  async dropAndResume() {
    const chat = new Chat({ id: chatId, transport: transport(options.body) });
    const sending = chat.sendMessage({ text: 'go' });
    await waitFor('the first text', () => chat.messages.length === 2 && text(chat.messages[1]).length > 0);
    await chat.stop();
    await sending;
    const before = text(chat.messages[1]);
    await follow(chat, before.length);
    return seen(chat, { before });
  },

  // reconnectToStream alone (a page that loads while a turn runs, or none does); with
  // options.running, RESUMED on stderr once text streams (the test then ends the turn).
  async resume() {
    const chat = new Chat({ id: chatId, transport: transport(options.body) });
    if (options.running) await follow(chat, 0);
    else await chat.resumeStream();
    return seen(chat);
  },
};

try {
  process.stdout.write(JSON.stringify(await scenarios[scenario]()));
} catch (error) {
  if (latest) process.stderr.write(`the chat: ${JSON.stringify(seen(latest))}\n`);
  throw error;
}
