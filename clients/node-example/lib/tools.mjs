// The tools: this app is also a tool host. The sidecar lists them (ListTools) at start-up and
// whenever this process comes back, offers them to the model next to its own, and runs a call
// here (ExecuteTool) when the model makes one, after the hooks' beforeToolCall allowed it
// (protos/turnwire/v1/tools.proto; docs/tools.md). `defineTool` from @turnwire/client/kit: a
// returned value is the result the model reads; an async generator's yields are progress the
// client sees (the model does not) and its return value the result; a thrown error is the
// call's error, which the model reads.

import { setTimeout as sleep } from 'node:timers/promises';

import { defineTool } from '@turnwire/client/kit';

const ORDER_ID = { type: 'string', description: 'The order id, e.g. A-17' };

/** The example's tools. */
export const TOOLS = [
  defineTool({
    name: 'lookup_order',
    description: 'The status of an order.',
    inputSchema: { type: 'object', properties: { order_id: ORDER_ID }, required: ['order_id'] },
    execute: ({ order_id }) => ({ order_id, status: 'shipped', carrier: 'DHL' }),
  }),

  // A streaming tool: each yield is a preliminary result; `signal` aborts when the call is
  // cancelled (the turn was cancelled, or the call's deadline passed).
  defineTool({
    name: 'pack_order',
    description: 'Packs the items of an order, reporting progress as it goes.',
    inputSchema: {
      type: 'object',
      properties: {
        order_id: ORDER_ID,
        items: { type: 'integer', minimum: 1, maximum: 1000 },
        delay_ms: { type: 'integer', minimum: 0, description: 'time per item' },
      },
      required: ['order_id', 'items'],
    },
    async *execute({ order_id, items, delay_ms = 50 }, { signal }) {
      for (let packed = 1; packed <= items; packed++) {
        await sleep(delay_ms, undefined, { signal }); // throws once the call is cancelled
        yield { order_id, packed, of: items };
      }
      return { order_id, packed: items, done: true };
    },
  }),

  defineTool({
    name: 'refund_order',
    description: 'Refunds an order. Only admins may (the beforeToolCall policy enforces it).',
    inputSchema: { type: 'object', properties: { order_id: ORDER_ID }, required: ['order_id'] },
    // context.idempotencyKey is the same for this call on every attempt, recovery and replica:
    // a real refund would hand it to the payment system so that it happens once.
    execute: ({ order_id }, { idempotencyKey }) => ({ order_id, refunded: true, idempotency_key: idempotencyKey }),
  }),
];

/**
 * `tools`, each call recorded in `journal` (before it runs) and its cancellation too.
 *
 * @param {import('./journal.mjs').Journal} journal
 * @param {import('@turnwire/client/kit').Tool[]} [tools]  default TOOLS
 */
export function journaled(journal, tools = TOOLS) {
  return tools.map((tool) =>
    defineTool({
      ...tool,
      execute(input, context) {
        const { requestId, conversationId, toolCallId, toolName, stepNumber, idempotencyKey, signal } = context;
        const ids = { requestId, conversationId, toolCallId, toolName, stepNumber, idempotencyKey };
        journal.record({ rpc: 'ExecuteTool', ...ids, input: context.inputJson });
        signal.addEventListener('abort', () => journal.record({ rpc: 'ExecuteTool:cancelled', ...ids }), { once: true });
        return tool.execute(input, context);
      },
    }),
  );
}
