// The hook handlers: the sidecar calls these at each point of a turn (protos/turnwire/v1/hooks.proto;
// the rules in middleware/README.md §10). `hooks(createHooks(...))` from @turnwire/client/kit
// serves them: it subscribes to exactly the hooks written here and serves them both as unary RPCs
// and on the HookSession stream the sidecar prefers.
//
// What this hook server does:
//   beforeTurn      adds the caller's `body` (ChatRequest.body) to the system prompt
//   beforeToolCall  a policy: blocks refund_order unless body.role is "admin", substitutes a
//                   dry-run answer for tools with effects when body.dry_run is true, normalizes
//                   lookup_order's order id; everything else runs as the model asked
//   onChatResponse  records the finished turn (and, when body.follow_up is a text, sends it as
//                   the next user message with SaveMessages: a follow-up turn)
//   the others      only record the call, so the journal shows the order of a turn's hooks
//
// A handler gets the request (protobuf-es messages: lowerCamelCase fields, `turn.body` a plain
// object) and a context (parentRequestId, signal, input for beforeToolCall) and returns the
// answer as a plain object, or nothing for "no change". A thrown error fails the call: the
// sidecar applies the entry's failure mode.

import { Role } from '@turnwire/client';
import { ToolCallOutcome, TurnOutcome, allowWithInput, block, substitute } from '@turnwire/client/kit';

/** Tools that change something: a dry run must not execute them. */
const TOOLS_WITH_EFFECTS = new Set(['pack_order', 'refund_order']);

/** A tool call decision from the policy (a BeforeToolCall answer); undefined: run it as it is. */
export function decide(toolName, input, body) {
  if (toolName === 'refund_order' && body.role !== 'admin') {
    return block('Refunds need an admin: tell the user to contact support.');
  }
  if (body.dry_run === true && TOOLS_WITH_EFFECTS.has(toolName)) {
    return substitute({ dry_run: true, would_call: toolName, input });
  }
  if (toolName === 'lookup_order' && typeof input.order_id === 'string') {
    const normalized = input.order_id.trim().toUpperCase();
    if (normalized !== input.order_id) return allowWithInput({ ...input, order_id: normalized });
  }
  return undefined;
}

/** The decision's name for the journal: allow, allowWithInput, block or substitute. */
const decisionName = (decision) => decision?.decision.case ?? 'allow';

/**
 * The hook handlers (a HookHandlers object for `hooks()`).
 *
 * @param {object} options
 * @param {import('./journal.mjs').Journal} options.journal  where calls and turns are recorded
 * @param {import('@turnwire/client').TurnwireClient} [options.client]  the sidecar, for follow-up turns
 * @param {(line: string) => void} [options.log]  where a line per finished turn goes
 */
export function createHooks({ journal, client, log = () => {} }) {
  // The turn's identity, as every request carries it in `turn` (TurnInfo).
  const ids = (turn) => ({ requestId: turn.requestId, conversationId: turn.conversationId });

  return {
    beforeTurn({ turn, system }) {
      journal.record({ rpc: 'BeforeTurn', ...ids(turn), attempt: turn.attempt, body: turn.body });
      if (!turn.body || Object.keys(turn.body).length === 0) return undefined; // nothing to add
      return { system: `${system}\n\nAbout this request: ${JSON.stringify(turn.body)}` };
    },

    beforeStep({ turn, stepNumber, system, model }) {
      journal.record({ rpc: 'BeforeStep', ...ids(turn), stepNumber, system, model });
    },

    beforeToolCall({ turn, call }, { input }) {
      const decision = decide(call.toolName, input, turn.body ?? {});
      journal.record({
        rpc: 'BeforeToolCall',
        ...ids(turn),
        stepNumber: call.stepNumber,
        toolName: call.toolName,
        toolCallId: call.toolCallId,
        decision: decisionName(decision),
      });
      return decision;
    },

    afterToolCall({ turn, call, outcome, success, outputJson, error }) {
      journal.record({
        rpc: 'AfterToolCall',
        ...ids(turn),
        stepNumber: call.stepNumber,
        toolName: call.toolName,
        toolCallId: call.toolCallId,
        outcome: `TOOL_CALL_OUTCOME_${ToolCallOutcome[outcome]}`,
        success,
        output: success ? outputJson : error,
      });
    },

    onStepFinish({ turn, step, text }) {
      journal.record({ rpc: 'OnStepFinish', ...ids(turn), stepNumber: step.stepNumber, finishReason: step.finishReason, text });
    },

    // One call per turn, a batch of events per message. Count them here; never do slow work per event.
    async onChunks(batches) {
      let turn;
      const counts = {};
      for await (const batch of batches) {
        turn ??= batch.turn;
        for (const { event } of batch.events) counts[event.case] = (counts[event.case] ?? 0) + 1;
      }
      journal.record({ rpc: 'OnChunks', ...(turn ? ids(turn) : {}), counts });
    },

    onChatResponse({ turn, message, outcome }, { parentRequestId }) {
      const parts = (message?.parts ?? []).map((part) => part.kind);
      const text = parts.filter((p) => p.case === 'text').map((p) => p.value.text).join(' ');
      const tools = parts.filter((p) => p.case === 'toolCall').map((p) => p.value.toolName);
      const outcomeName = `TURN_OUTCOME_${TurnOutcome[outcome]}`;
      journal.record({ rpc: 'OnChatResponse', ...ids(turn), outcome: outcomeName, text, tools });
      log(`turn ${turn.requestId} on ${turn.conversationId}: ${outcomeName}, tools [${tools.join(', ')}]: ${text}`);
      // Not awaited: a server that does not observe this hook holds the client's TurnEnd until it answers.
      const followUp = turn.body?.follow_up;
      if (client && typeof followUp === 'string') startFollowUp(turn, followUp, parentRequestId);
    },
  };

  // From OnChatResponse the turn's lock is released, so a SaveMessages on the same conversation
  // is admitted as the next turn. The parent request id tells the sidecar where the call comes
  // from (from inside a running turn, a blocking call on its conversation is refused instead of
  // waiting forever for the lock that turn holds).
  async function startFollowUp(turn, text, parentRequestId) {
    let status;
    try {
      const message = { role: Role.USER, parts: [{ kind: { case: 'text', value: { text } } }] };
      const result = await client.saveMessages(turn.conversationId, [message], { parentRequestId }).collect();
      status = `TURN_STATUS_${result.status}`;
    } catch (error) {
      status = `error ${error.code}: ${error.rawMessage ?? error.message}`;
    }
    journal.record({ rpc: 'follow_up', ...ids(turn), status });
  }
}
