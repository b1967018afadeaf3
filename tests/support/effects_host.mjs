// A tool host on the TypeScript kit for the tool-effects tests (docs/semantics.md §8, "Tool
// effects"), run by tests/e2e/test_tool_effects_e2e.py as a child process:
//
//   node tests/support/effects_host.mjs --listen HOST:PORT --log FILE
//
// One tool, `charge_ts`, declared idempotent: each run appends {"call", "key", "rerun"} as a JSON
// line to FILE (it outlives the sidecar's SIGKILL), then waits until the sidecar cancels the call,
// except a re-run, which answers at once. Prints "listening on HOST:PORT" once it serves.

import { appendFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

import { defineTool, serve } from '@turnwire/client/kit';

const { values } = parseArgs({ options: { listen: { type: 'string' }, log: { type: 'string' } } });

const chargeTs = defineTool({
  name: 'charge_ts',
  description: 'Charge a card, keyed by the idempotency key.',
  inputSchema: { type: 'object', properties: {} },
  idempotent: true,
  async execute(_input, context) {
    appendFileSync(
      values.log,
      `${JSON.stringify({ call: context.toolCallId, key: context.idempotencyKey, rerun: context.rerun })}\n`,
    );
    if (!context.rerun) {
      await new Promise((resolve) => context.signal.addEventListener('abort', resolve, { once: true }));
    }
    return `charged ${context.idempotencyKey}`;
  },
});

const served = await serve({ tools: [chargeTs], listen: values.listen });
console.log(`listening on ${served.address}`);
