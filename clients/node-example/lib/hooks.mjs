// The TurnHooksService handlers: the sidecar calls these at each point of a turn
// (protos/turnwire/v1/hooks.proto; the rules in middleware/README.md §10).
//
// What this hook server does:
//   BeforeTurn      adds the caller's `body` (ChatRequest.body) to the system prompt
//   BeforeToolCall  a policy: blocks refund_order unless body.role is "admin", substitutes a
//                   dry-run answer for tools with effects when body.dry_run is true, normalizes
//                   lookup_order's order id; everything else runs as the model asked
//   OnChatResponse  records the finished turn (and, when body.follow_up is a text, sends it as
//                   the next user message with SaveMessages: a follow-up turn)
//   the others      only record the call, so the journal shows the order of a turn's hooks
//
// Every handler has the grpc-js shape (call, callback): call.request is the request message,
// callback(null, response) answers, callback(error) fails the call. An answer with no fields
// set means "no change" (for BeforeToolCall: run the tool as it is).

import { fromStruct, parentMetadata, parentRequestIdOf, sidecarClient, userMessage } from './proto.mjs';

/** Tools that change something: a dry run must not execute them. */
const TOOLS_WITH_EFFECTS = new Set(['pack_order', 'refund_order']);

/** The hooks this server subscribes to by default (GetHookSubscriptions). */
export const DEFAULT_HOOKS = [
  'HOOK_BEFORE_TURN',
  'HOOK_BEFORE_STEP',
  'HOOK_BEFORE_TOOL_CALL',
  'HOOK_AFTER_TOOL_CALL',
  'HOOK_ON_STEP_FINISH',
  'HOOK_ON_CHUNKS',
  'HOOK_ON_CHAT_RESPONSE',
];

/** A tool call decision (BeforeToolCallResponse) from the policy; undefined: run it as it is. */
export function decide(toolName, input, body) {
  if (toolName === 'refund_order' && body.role !== 'admin') {
    return { block: { reason: 'Refunds need an admin: tell the user to contact support.' } };
  }
  if (body.dry_run === true && TOOLS_WITH_EFFECTS.has(toolName)) {
    return { substitute: { outputJson: JSON.stringify({ dry_run: true, would_call: toolName, input }) } };
  }
  if (toolName === 'lookup_order' && typeof input.order_id === 'string') {
    const normalized = input.order_id.trim().toUpperCase();
    if (normalized !== input.order_id) {
      return { allowWithInput: { inputJson: JSON.stringify({ ...input, order_id: normalized }) } };
    }
  }
  return undefined;
}

/**
 * The TurnHooksService implementation.
 *
 * @param {object} options
 * @param {import('./journal.mjs').Journal} options.journal  where calls and turns are recorded
 * @param {string} [options.sidecar]  the sidecar's HOST:PORT, for follow-up turns
 * @param {string[]} [options.hooks]  the hooks to subscribe to (default DEFAULT_HOOKS)
 * @param {(line: string) => void} [options.log]  where a line per finished turn goes
 */
export function createHooks({ journal, sidecar, hooks = DEFAULT_HOOKS, log = () => {} }) {
  const client = sidecar ? sidecarClient(sidecar) : null;
  // The turn's identity, as every request carries it in `turn` (TurnInfo).
  const ids = (turn) => ({ requestId: turn.requestId, conversationId: turn.conversationId });

  return {
    GetHookSubscriptions(call, callback) {
      journal.record({ rpc: 'GetHookSubscriptions' });
      callback(null, { hooks, includeMessages: false });
    },

    BeforeTurn(call, callback) {
      const { turn, system } = call.request;
      const body = fromStruct(turn.body);
      journal.record({ rpc: 'BeforeTurn', ...ids(turn), attempt: turn.attempt, body });
      if (Object.keys(body).length === 0) return callback(null, {}); // nothing to add
      callback(null, { system: `${system}\n\nAbout this request: ${JSON.stringify(body)}` });
    },

    BeforeStep(call, callback) {
      const { turn, stepNumber, system, model } = call.request;
      journal.record({ rpc: 'BeforeStep', ...ids(turn), stepNumber, system, model });
      callback(null, {});
    },

    BeforeToolCall(call, callback) {
      const { turn, call: toolCall } = call.request;
      const input = JSON.parse(toolCall.inputJson || '{}');
      const decision = decide(toolCall.toolName, input, fromStruct(turn.body));
      journal.record({
        rpc: 'BeforeToolCall',
        ...ids(turn),
        stepNumber: toolCall.stepNumber,
        toolName: toolCall.toolName,
        toolCallId: toolCall.toolCallId,
        decision: decision ? Object.keys(decision)[0] : 'allow',
      });
      callback(null, decision ?? {});
    },

    AfterToolCall(call, callback) {
      const { turn, call: toolCall, outcome, success, outputJson, error } = call.request;
      journal.record({
        rpc: 'AfterToolCall',
        ...ids(turn),
        stepNumber: toolCall.stepNumber,
        toolName: toolCall.toolName,
        toolCallId: toolCall.toolCallId,
        outcome,
        success,
        output: success ? outputJson : error,
      });
      callback(null, {});
    },

    OnStepFinish(call, callback) {
      const { turn, step, text } = call.request;
      journal.record({ rpc: 'OnStepFinish', ...ids(turn), stepNumber: step.stepNumber, finishReason: step.finishReason, text });
      callback(null, {});
    },

    // Client streaming: one call per turn, a request per batch of events. Count them here;
    // never do slow work per event.
    OnChunks(call, callback) {
      let turn = null;
      const counts = {};
      call.on('data', (request) => {
        turn ??= request.turn;
        for (const event of request.events) counts[event.event] = (counts[event.event] ?? 0) + 1;
      });
      call.on('end', () => {
        journal.record({ rpc: 'OnChunks', ...(turn ? ids(turn) : {}), counts });
        callback(null, {});
      });
    },

    OnChatResponse(call, callback) {
      const { turn, message, outcome } = call.request;
      const parts = message?.parts ?? [];
      const text = parts.filter((p) => p.kind === 'text').map((p) => p.text.text).join(' ');
      const tools = parts.filter((p) => p.kind === 'toolCall').map((p) => p.toolCall.toolName);
      journal.record({ rpc: 'OnChatResponse', ...ids(turn), outcome, text, tools });
      log(`turn ${turn.requestId} on ${turn.conversationId}: ${outcome}, tools [${tools.join(', ')}]: ${text}`);
      callback(null, {});
      // Answer first: the sidecar waits for this hook before it sends TurnEnd to the client.
      const followUp = fromStruct(turn.body).follow_up;
      if (client && typeof followUp === 'string') startFollowUp(turn, followUp, parentRequestIdOf(call));
    },
  };

  // From OnChatResponse the turn's lock is released, so a SaveMessages on the same conversation
  // is admitted as the next turn. The parent request id tells the sidecar where the call comes
  // from (from inside a running turn, a blocking call on its conversation is refused instead of
  // waiting forever for the lock that turn holds).
  function startFollowUp(turn, text, parent) {
    const stream = client.SaveMessages(
      { conversationId: turn.conversationId, messages: [userMessage(text)] },
      parentMetadata(parent),
    );
    let status = 'NO_TURN_END';
    stream.on('data', ({ event }) => {
      if (event.event === 'turnEnd') status = event.turnEnd.status;
    });
    stream.on('error', (error) => (status = `error ${error.code}: ${error.details}`));
    // 'status' comes once, after the last message or the error.
    stream.on('status', () => journal.record({ rpc: 'follow_up', ...ids(turn), status }));
  }
}
