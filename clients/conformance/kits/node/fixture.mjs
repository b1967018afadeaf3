#!/usr/bin/env node
// The kit conformance fixture (clients/conformance/kits/SPEC.md) on the TypeScript kit,
// @turnwire/client/kit, written as a user would write it.
//
//   node clients/conformance/kits/node/fixture.mjs --port N --journal PATH

import { writeFileSync, appendFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';

import {
  ToolCallOutcome,
  TurnOutcome,
  allowWithInput,
  block,
  defineTool,
  hooks,
  parseKitJson,
  serve,
  stringifyKitJson,
} from '@turnwire/client/kit';

const SLEEP_MS = 30_000; // a "sleep" hook waits this long at most (the sidecar's deadline comes first)
const SLOW_MS = 60_000; // the slow tool waits this long at most (the cancellation comes first)
const BIG = 18446744073709551616n; // 2^64: the stream tool's results carry integers beyond 2^53

const { values } = parseArgs({ options: { port: { type: 'string' }, journal: { type: 'string' } } });
writeFileSync(values.journal, '');

/** Appends one whole JSON line (integers exact) before the caller answers. */
function journal(event, members) {
  appendFileSync(values.journal, `${stringifyKitJson({ event, ...members })}\n`);
}

/** body.fixture: what the turn asks the hooks to do (SPEC.md §2). */
function controlsOf(turn) {
  const controls = turn?.body?.fixture;
  return controls && typeof controls === 'object' && !Array.isArray(controls) ? controls : {};
}

/**
 * When the turn asks `hook` to: sleeps until the sidecar gives the call up (or 30 s) and resolves
 * true (answer no change), or fails. Resolves false otherwise.
 */
async function misbehaved(turn, hook, signal) {
  const asked = controlsOf(turn)[hook];
  if (asked === 'fail') throw new Error(`fixture: ${hook} failed on purpose`);
  if (asked !== 'sleep') return false;
  await sleep(SLEEP_MS, undefined, { signal }).catch(() => {}); // aborted: the sidecar gave up
  return true;
}

/** TurnEvent's oneof member as its proto field name (textDelta → text_delta). */
const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

const hookServer = hooks({
  async beforeTurn({ turn, system }, { signal, parentRequestId }) {
    journal('before_turn', {
      request_id: turn.requestId,
      system,
      attempt: turn.attempt,
      parent_request_id: parentRequestId,
    });
    if (await misbehaved(turn, 'before_turn', signal)) return undefined;
    const { system: wanted } = controlsOf(turn);
    return typeof wanted === 'string' ? { system: wanted } : undefined;
  },

  // Declared observed (`observe` below): the sidecar does not wait for it on HookSession.
  beforeStep({ turn, stepNumber }) {
    journal('before_step', { request_id: turn.requestId, step_number: stepNumber });
  },

  async beforeToolCall({ turn, call }, { input, signal }) {
    journal('before_tool_call', { request_id: turn.requestId, tool_call_id: call.toolCallId, tool_name: call.toolName, input });
    if ((await misbehaved(turn, 'before_tool_call', signal)) || call.toolName !== 'echo') return undefined;
    if (input.text === 'blocked') return block('echo refused: "blocked" is not allowed');
    if (input.text === 'secret') return allowWithInput({ ...input, text: '[redacted]' });
    return undefined;
  },

  afterToolCall({ turn, call, success, outcome, outputJson, error }) {
    journal('after_tool_call', {
      request_id: turn.requestId,
      tool_call_id: call.toolCallId,
      tool_name: call.toolName,
      success,
      outcome: ToolCallOutcome[outcome],
      output: outputJson ? parseKitJson(outputJson) : null,
      error,
    });
  },

  onStepFinish({ turn, step, text }) {
    journal('on_step_finish', { request_id: turn.requestId, step_number: step.stepNumber, tool_names: step.toolNames, text });
  },

  async onChunks(batches) {
    let requestId;
    const kinds = [];
    for await (const batch of batches) {
      requestId ??= batch.turn?.requestId;
      for (const event of batch.events) kinds.push(snake(event.event.case));
    }
    journal('on_chunks', { request_id: requestId ?? '', kinds });
  },

  onChatResponse({ turn, outcome }) {
    journal('on_chat_response', { request_id: turn.requestId, outcome: TurnOutcome[outcome] });
  },
}, { observe: ['beforeStep'] });

/** Every ExecuteTool's first record (SPEC.md §4). */
function toolCall(input, context) {
  journal('tool_call', {
    request_id: context.requestId,
    tool_call_id: context.toolCallId,
    tool_name: context.toolName,
    idempotency_key: context.idempotencyKey,
    input,
  });
}

const tools = [
  defineTool({
    name: 'echo',
    description: 'Returns its input.',
    inputSchema: {
      type: 'object',
      properties: { text: { type: 'string' }, big: { type: 'integer' }, nested: { type: 'object' } },
      required: ['text'],
    },
    execute(input, context) {
      toolCall(input, context);
      return { echo: input };
    },
  }),
  defineTool({
    name: 'stream',
    description: 'Counts to `count`, a preliminary result each.',
    inputSchema: { type: 'object', properties: { count: { type: 'integer' } }, required: ['count'] },
    async *execute(input, context) {
      toolCall(input, context);
      for (let index = 1; index <= input.count; index++) yield { index, big: BIG + BigInt(index) };
      return { done: input.count };
    },
  }),
  defineTool({
    name: 'slow',
    description: 'Waits until cancelled.',
    inputSchema: { type: 'object' },
    async execute(input, context) {
      toolCall(input, context);
      try {
        await sleep(SLOW_MS, undefined, { signal: context.signal });
        return { finished: true };
      } catch (error) {
        if (!context.signal.aborted) throw error;
        journal('tool_cancelled', { request_id: context.requestId, tool_call_id: context.toolCallId, tool_name: context.toolName });
        return undefined; // nothing more is sent once cancelled
      }
    },
  }),
  defineTool({
    name: 'fail',
    description: 'Fails with `reason`.',
    inputSchema: { type: 'object', properties: { reason: { type: 'string' } }, required: ['reason'] },
    execute(input, context) {
      toolCall(input, context);
      throw new Error(`fixture tool failed: ${input.reason}`);
    },
  }),
];

const served = await serve({ hooks: hookServer, tools, listen: `127.0.0.1:${values.port}` });
process.stdout.write(`turnwire-kit-fixture listening on 127.0.0.1:${served.port}\n`);
process.once('SIGTERM', () => {
  served.server.forceShutdown();
  process.exit(0);
});
