// The ToolExecutorService handlers: this app is also a tool host. The sidecar lists the tools
// (ListTools) at start-up and whenever this process comes back, offers them to the model next to
// its own, and runs a call here (ExecuteTool) when the model makes one, after the hooks'
// BeforeToolCall allowed it (protos/turnwire/v1/tools.proto; docs/tools.md).
//
// An ExecuteTool call is a server stream: write zero or more {preliminaryOutputJson} (shown to
// the client as they come, not to the model), then exactly one {outputJson} (the result the
// model reads) or {error} (a failure the model reads), then end the call. An ordinary failure is
// an {error} message, not a failed RPC.

import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";

import { toStruct } from "./proto.mjs";

/** New for every process: tells the sidecar that this host restarted, so it lists again. */
const INSTANCE_ID = randomUUID();

const ORDER_ID = { type: "string", description: "The order id, e.g. A-17" };

/** The tools, as the model sees them (ToolSpec without the Struct wrapping). */
export const TOOLS = [
  {
    name: "lookup_order",
    description: "The status of an order.",
    inputSchema: {
      type: "object",
      properties: { order_id: ORDER_ID },
      required: ["order_id"],
    },
  },
  {
    name: "pack_order",
    description: "Packs the items of an order, reporting progress as it goes.",
    inputSchema: {
      type: "object",
      properties: {
        order_id: ORDER_ID,
        items: { type: "integer", minimum: 1, maximum: 1000 },
        delay_ms: { type: "integer", minimum: 0, description: "time per item" },
      },
      required: ["order_id", "items"],
    },
  },
  {
    name: "refund_order",
    description:
      "Refunds an order. Only admins may (the BeforeToolCall policy enforces it).",
    inputSchema: {
      type: "object",
      properties: { order_id: ORDER_ID },
      required: ["order_id"],
    },
  },
];

/** Runs one call; yields preliminary results and returns the final one (thrown errors become `error`). */
const RUN = {
  async *lookup_order({ order_id }) {
    return { order_id, status: "shipped", carrier: "DHL" };
  },

  // A streaming tool: each yield is a preliminary result; `signal` aborts when the call is
  // cancelled (the turn was cancelled, or the call's deadline passed).
  async *pack_order({ order_id, items, delay_ms = 50 }, signal) {
    for (let packed = 1; packed <= items; packed++) {
      await sleep(delay_ms, undefined, { signal }); // throws once the call is cancelled
      yield { order_id, packed, of: items };
    }
    return { order_id, packed: items, done: true };
  },

  async *refund_order({ order_id }) {
    return { order_id, refunded: true };
  },
};

/**
 * The ToolExecutorService implementation.
 *
 * @param {object} options
 * @param {import('./journal.mjs').Journal} options.journal  where calls are recorded
 * @param {Record<string, Function>} [options.extra]  more tools: name → async generator
 *   function (input, signal, call) (their specs go in `extraSpecs`)
 * @param {object[]} [options.extraSpecs]
 */
export function createTools({ journal, extra = {}, extraSpecs = [] }) {
  const run = { ...RUN, ...extra };
  const specs = [...TOOLS, ...extraSpecs].map((tool) => ({
    ...tool,
    inputSchema: toStruct(tool.inputSchema),
  }));

  return {
    ListTools(call, callback) {
      journal.record({ rpc: "ListTools" });
      callback(null, { tools: specs, instanceId: INSTANCE_ID });
    },

    async ExecuteTool(call) {
      const {
        toolName,
        toolCallId,
        requestId,
        conversationId,
        inputJson,
        stepNumber,
        idempotencyKey,
      } = call.request;
      // idempotencyKey: the same for this call on every attempt, recovery and replica; a tool with
      // effects would hand it to the system it changes (docs/tools.md, "Idempotency keys").
      const ids = {
        requestId,
        conversationId,
        toolCallId,
        toolName,
        stepNumber,
        idempotencyKey,
      };
      journal.record({ rpc: "ExecuteTool", ...ids, input: inputJson });
      const aborted = new AbortController();
      let ended = false;
      call.on("cancelled", () => {
        // grpc-js may also report a call the sidecar closed after the final result: not a cancel.
        if (ended) return;
        journal.record({ rpc: "ExecuteTool:cancelled", ...ids });
        aborted.abort();
      });
      try {
        const tool = run[toolName];
        if (!tool) throw new Error(`this host has no tool ${toolName}`);
        const calls = tool(JSON.parse(inputJson), aborted.signal, call);
        for (;;) {
          const { value, done } = await calls.next();
          if (aborted.signal.aborted) return; // nobody is listening any more
          if (done) {
            call.write({ outputJson: JSON.stringify(value) });
            break;
          }
          call.write({ preliminaryOutputJson: JSON.stringify(value) });
        }
      } catch (error) {
        if (aborted.signal.aborted) return;
        call.write({ error: error.message });
      }
      ended = true;
      call.end();
    },
  };
}
