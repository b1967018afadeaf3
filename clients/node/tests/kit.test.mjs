// @turnwire/client/kit against a grpc-js client playing the sidecar: the subscription list
// derived from the handlers, decisions, thrown errors as the contract's errors (unary and on
// HookSession), streaming tools in order, integers beyond 2^53 kept exact both ways, and a
// cancelled call aborting the tool's signal. kit_sidecar.test.mjs runs it under a real sidecar.
//
// Run: npm test -w @turnwire/client (after npm run build -w @turnwire/client), or `make test`.

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import * as grpc from '@grpc/grpc-js';
import {
  Hook,
  PARENT_REQUEST_ID,
  TOOL_EXECUTOR_SERVICE,
  TURN_HOOKS_SERVICE,
  allowWithInput,
  block,
  defineTool,
  hooks,
  serve,
  substitute,
} from '@turnwire/client/kit';

import { waitUntil } from './sidecar.mjs';

const BIG = 12345678901234567890n; // beyond 2^53: a double would round it

/** What the handlers saw, by name; `aborted` resolves with the reason a tool's signal aborted. */
const seen = {};
let abortedReason;
const aborted = new Promise((resolve) => (abortedReason = resolve));

const hookServer = hooks({
  async beforeTurn(request, { signal }) {
    if (request.turn.body.wait) {
      // Waits for the sidecar to give up: the call's deadline aborts the signal.
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      seen.deadline = signal.reason.name;
    }
    return { system: `${request.system} (${request.turn.body.user})` };
  },
  async onChunks(batches, { parentRequestId }) {
    const kinds = [];
    for await (const batch of batches) kinds.push(...batch.events.map(({ event }) => event.case));
    seen.chunks = { kinds, parentRequestId };
  },
  beforeToolCall(request, context) {
    seen.beforeToolCall = { input: context.input, parent: context.parentRequestId };
    const { toolName } = request.call;
    if (toolName === 'refund') return block('refunds need an admin');
    if (toolName === 'dry') return substitute({ dry_run: true, n: BIG });
    if (toolName === 'fail') throw new Error('policy store unreachable');
    if (toolName === 'denied') throw Object.assign(new Error('no'), { code: grpc.status.PERMISSION_DENIED });
    if (toolName === 'big') return allowWithInput({ ...context.input, n: context.input.n + 1n });
    return undefined;
  },
  onChatResponse() {},
});

const TOOLS = [
  defineTool({
    name: 'pack',
    description: 'Packs items, reporting progress.',
    inputSchema: { type: 'object', properties: { items: { type: 'integer' } }, required: ['items'] },
    async *execute({ items }, context) {
      seen.pack = { idempotencyKey: context.idempotencyKey, parent: context.parentRequestId };
      for (let packed = 1; packed <= items; packed++) yield { packed, of: items };
      return { done: true, packed: items };
    },
  }),
  defineTool({
    name: 'echo',
    description: 'Returns its input.',
    inputSchema: { type: 'object' },
    timeoutMs: 1500,
    execute: (input) => input,
  }),
  defineTool({
    name: 'ship',
    description: 'Ships order lines (required members at every depth).',
    inputSchema: {
      type: 'object',
      properties: {
        lines: {
          type: 'array',
          items: { type: 'object', properties: { sku: { type: 'string' } }, required: ['sku'] },
        },
        to: { type: 'object', properties: { city: { type: 'string' } } },
        labels: { type: 'object', additionalProperties: { type: 'object', required: ['text'] } },
      },
      required: ['lines'],
    },
    execute: ({ lines }) => ({ lines: lines.length }),
  }),
  defineTool({
    name: 'broken',
    description: 'Always fails.',
    inputSchema: { type: 'object' },
    async execute() {
      throw new Error('the warehouse is closed');
    },
  }),
  defineTool({
    name: 'wait',
    description: 'Runs until cancelled.',
    inputSchema: { type: 'object' },
    async *execute(_input, { signal }) {
      yield 'started';
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      abortedReason(signal.reason?.name);
      yield 'never sent';
      return 'never sent';
    },
  }),
];

const HooksClient = grpc.makeGenericClientConstructor(TURN_HOOKS_SERVICE, 'TurnHooksService');
const ToolsClient = grpc.makeGenericClientConstructor(TOOL_EXECUTOR_SERVICE, 'ToolExecutorService');
let served;
let hooksClient;
let toolsClient;

before(async () => {
  served = await serve({ hooks: hookServer, tools: TOOLS, listen: '127.0.0.1:0' });
  hooksClient = new HooksClient(served.address, grpc.credentials.createInsecure());
  toolsClient = new ToolsClient(served.address, grpc.credentials.createInsecure());
});

after(async () => {
  hooksClient.close();
  toolsClient.close();
  await served.close();
});

const turn = { conversationId: 'c-1', requestId: 'r-1', body: { user: 'ada' }, attempt: 1 };

function metadata() {
  const m = new grpc.Metadata();
  m.set(PARENT_REQUEST_ID, 'r-1');
  return m;
}

function unary(client, rpc, request) {
  return new Promise((resolve, reject) =>
    client[rpc](request, metadata(), (error, response) => (error ? reject(error) : resolve(response))),
  );
}

function toolCall(toolName, input) {
  return {
    toolName,
    inputJson: input,
    requestId: 'r-1',
    conversationId: 'c-1',
    toolCallId: 't-1',
    idempotencyKey: 'tw-k-1',
  };
}

/** Runs ExecuteTool; resolves with its messages as [case, value] pairs. */
function execute(toolName, inputJson) {
  return new Promise((resolve, reject) => {
    const messages = [];
    const call = toolsClient.ExecuteTool(toolCall(toolName, inputJson), metadata());
    call.on('data', ({ result }) => messages.push([result.case, result.value]));
    call.on('error', reject);
    call.on('end', () => resolve(messages));
  });
}

test('the subscriptions are the hooks that have handlers, on HookSession', async () => {
  const answer = await unary(hooksClient, 'GetHookSubscriptions', {});
  assert.deepEqual(answer.hooks, [
    Hook.BEFORE_TURN,
    Hook.BEFORE_TOOL_CALL,
    Hook.ON_CHUNKS,
    Hook.ON_CHAT_RESPONSE,
  ]);
  assert.equal(answer.hookSession, true);
  assert.equal(answer.hookSessionChunks, true); // OnChunks on HookSession too: kit_session_chunks.test.mjs
  assert.equal(answer.includeMessages, false);
  assert.throws(() => hooks({ beforeToolcall() {} }), /"beforeToolcall" is no hook/);
  // No handler, or nothing to serve: refused, as the Python and Go kits refuse it (the sidecar
  // would call nothing; developer trial).
  assert.throws(() => hooks({}), /hooks\(\): no handler given/);
  assert.throws(() => hooks({ beforeTurn: undefined }), /no handler given/);
  await assert.rejects(serve({ listen: '127.0.0.1:0' }), /serve\(\): nothing to serve/);
  await assert.rejects(serve({ tools: [], listen: '127.0.0.1:0' }), /nothing to serve/);
});

test('a deciding hook answers a plain object; no answer is no change', async () => {
  assert.equal(
    (await unary(hooksClient, 'BeforeTurn', { turn, system: 'Be brief.' })).system,
    'Be brief. (ada)',
  );
  const allowed = await unary(hooksClient, 'BeforeToolCall', {
    turn,
    call: { toolName: 'lookup', inputJson: '{}' },
  });
  assert.equal(allowed.decision.case, undefined);
  const blocked = await unary(hooksClient, 'BeforeToolCall', {
    turn,
    call: { toolName: 'refund', inputJson: '{}' },
  });
  assert.deepEqual(
    [blocked.decision.case, blocked.decision.value.reason],
    ['block', 'refunds need an admin'],
  );
  assert.equal(seen.beforeToolCall.parent, 'r-1');
});

test('integers beyond 2^53 reach a hook and leave it exact', async () => {
  const input = `{"n":${BIG}}`;
  const changed = await unary(hooksClient, 'BeforeToolCall', {
    turn,
    call: { toolName: 'big', inputJson: input },
  });
  assert.equal(seen.beforeToolCall.input.n, BIG);
  assert.equal(changed.decision.value.inputJson, `{"n":${BIG + 1n}}`);
  const dry = await unary(hooksClient, 'BeforeToolCall', {
    turn,
    call: { toolName: 'dry', inputJson: '{}' },
  });
  assert.equal(dry.decision.value.outputJson, `{"dry_run":true,"n":${BIG}}`);
});

test("a hook's thrown error fails the call: UNKNOWN, or the error's gRPC code", async (t) => {
  // The unexpected error is written to stderr with its stack (as the Python kit logs it); the
  // deliberate refusal (a gRPC code) is not (an operator trial: the hook server showed nothing).
  const logged = t.mock.method(console, 'error', () => {});
  const failed = unary(hooksClient, 'BeforeToolCall', { turn, call: { toolName: 'fail', inputJson: '{}' } });
  await assert.rejects(failed, { code: grpc.status.UNKNOWN, details: 'policy store unreachable' });
  const denied = unary(hooksClient, 'BeforeToolCall', {
    turn,
    call: { toolName: 'denied', inputJson: '{}' },
  });
  await assert.rejects(denied, { code: grpc.status.PERMISSION_DENIED });
  assert.equal(logged.mock.callCount(), 1);
  const [prefix, error] = logged.mock.calls[0].arguments;
  assert.equal(prefix, 'turnwire kit: hook beforeToolCall failed:');
  assert.equal(error.message, 'policy store unreachable');
  // A hook without a handler is not served (and never subscribed).
  await assert.rejects(unary(hooksClient, 'BeforeStep', { turn }), { code: grpc.status.UNIMPLEMENTED });
});

test("a unary hook's signal aborts at the call's deadline", async () => {
  const late = new Promise((resolve, reject) =>
    hooksClient.BeforeTurn(
      { turn: { ...turn, body: { wait: true } } },
      metadata(),
      { deadline: Date.now() + 200 },
      (error) => (error ? resolve(error) : reject(new Error('answered after the deadline'))),
    ),
  );
  assert.equal((await late).code, grpc.status.DEADLINE_EXCEEDED);
  await waitUntil(() => seen.deadline, { what: 'the handler seeing its signal abort' });
});

test('onChunks gets the batches of the stream, in order, and answers at its end', async () => {
  await new Promise((resolve, reject) => {
    const call = hooksClient.OnChunks(metadata(), (error) => (error ? reject(error) : resolve()));
    const delta = (text) => ({ event: { case: 'textDelta', value: { delta: text } } });
    call.write({ turn, events: [{ event: { case: 'stepStart', value: {} } }, delta('a')] });
    call.write({ events: [delta('b'), { event: { case: 'textEnd', value: {} } }] });
    call.end();
  });
  assert.deepEqual(seen.chunks, {
    kinds: ['stepStart', 'textDelta', 'textDelta', 'textEnd'],
    parentRequestId: 'r-1',
  });
});

test('HookSession answers its calls in order, a failed one as its error, and goes on', async () => {
  const stream = hooksClient.HookSession(metadata());
  const answers = [];
  const ended = new Promise((resolve, reject) => {
    stream.on('data', (response) => answers.push(...response.answers));
    stream.on('error', reject);
    stream.on('end', resolve);
  });
  const call = (id, toolName) => ({
    id: BigInt(id),
    hook: { case: 'beforeToolCall', value: { turn, call: { toolName, inputJson: '{}' } } },
  });
  stream.write({ calls: [call(1, 'refund'), call(2, 'fail')] });
  stream.write({ calls: [{ id: 3n, hook: { case: 'beforeStep', value: { turn } } }, call(4, 'lookup')] });
  stream.write({ calls: [{ id: 5n, hook: { case: 'beforeTurn', value: { turn, system: 'S' } } }] });
  stream.end();
  await ended;
  assert.deepEqual(
    answers.map((a) => a.id),
    [1n, 2n, 3n, 4n, 5n],
  );
  assert.equal(answers[0].hook.value.decision.case, 'block');
  assert.deepEqual(
    [answers[1].error.code, answers[1].error.message],
    [grpc.status.UNKNOWN, 'policy store unreachable'],
  );
  assert.equal(answers[2].error.code, grpc.status.UNIMPLEMENTED); // no beforeStep handler
  assert.deepEqual(
    [answers[3].hook.case, answers[3].hook.value.decision.case],
    ['beforeToolCall', undefined],
  );
  assert.equal(answers[4].hook.value.system, 'S (ada)');
});

test('ListTools answers the definitions', async () => {
  const { tools, instanceId } = await unary(toolsClient, 'ListTools', {});
  assert.deepEqual(
    tools.map((t) => t.name),
    ['pack', 'echo', 'ship', 'broken', 'wait'],
  );
  assert.deepEqual(tools[0].inputSchema, TOOLS[0].inputSchema);
  assert.equal(tools[1].timeout.nanos, 500_000_000);
  assert.match(instanceId, /^[0-9a-f-]{36}$/);
  assert.throws(
    () => defineTool({ name: 'x', description: '', inputSchema: { type: 'string' }, execute() {} }),
    /object schema/,
  );
  // A timeout the sidecar would ignore (0 or less) is refused, not sent (a developer trial).
  for (const timeoutMs of [0, -5, Number.NaN]) {
    assert.throws(
      () =>
        defineTool({ name: 'x', description: '', inputSchema: { type: 'object' }, timeoutMs, execute() {} }),
      /timeoutMs must be milliseconds above 0/,
    );
  }
  // A name the sidecar would leave out is refused here, as the Python and Go kits refuse it.
  for (const name of ['look up', 'lookup.stock', 'x'.repeat(65)]) {
    assert.throws(
      () => defineTool({ name, description: '', inputSchema: { type: 'object' }, execute() {} }),
      /use 1-64 of A-Z a-z 0-9 _ -/,
    );
  }
  assert.equal(
    defineTool({ name: 'Look_up-2', description: '', inputSchema: { type: 'object' }, execute() {} }).name,
    'Look_up-2',
  );
});

test('a generator tool streams its preliminary results in order, then its final one', async () => {
  assert.deepEqual(await execute('pack', '{"items":3}'), [
    ['preliminaryOutputJson', '{"packed":1,"of":3}'],
    ['preliminaryOutputJson', '{"packed":2,"of":3}'],
    ['preliminaryOutputJson', '{"packed":3,"of":3}'],
    ['outputJson', '{"done":true,"packed":3}'],
  ]);
  assert.deepEqual(seen.pack, { idempotencyKey: 'tw-k-1', parent: 'r-1' });
});

test('a tool keeps integers beyond 2^53 exact', async () => {
  const text = `{"id":${BIG},"small":1.5,"list":[${-BIG}]}`;
  assert.deepEqual(await execute('echo', text), [['outputJson', text]]);
});

test("a tool's thrown error, an unknown tool and bad input are the call's error", async () => {
  assert.deepEqual(await execute('broken', '{}'), [['error', 'the warehouse is closed']]);
  assert.deepEqual(await execute('nope', '{}'), [['error', 'this host has no tool "nope"']]);
  const [[kind]] = await execute('echo', '{not json');
  assert.equal(kind, 'error');
  // A member the schema requires, missing or null, at any depth: the tool does not run, as in the
  // Python and Go kits (before the kit trial `execute` got the input without it).
  assert.deepEqual(await execute('pack', '{}'), [
    ['error', 'invalid input for tool "pack": member "items" is required'],
  ]);
  assert.deepEqual(await execute('pack', '{"items":null}'), [
    ['error', 'invalid input for tool "pack": member "items" is required, not null'],
  ]);
  assert.deepEqual(await execute('ship', '{"lines":[{"sku":"A"},{}],"to":{"city":"Oslo"}}'), [
    ['error', 'invalid input for tool "ship": member "lines.1.sku" is required'],
  ]);
  assert.deepEqual(await execute('ship', '{"lines":[],"to":{},"labels":{"x":{}}}'), [
    ['error', 'invalid input for tool "ship": member "labels.x.text" is required'],
  ]);
  assert.deepEqual(await execute('ship', '{"lines":[{"sku":"A"}]}'), [['outputJson', '{"lines":1}']]);
});

test("cancelling the call aborts the tool's signal and nothing more is written", async () => {
  const messages = [];
  const call = toolsClient.ExecuteTool(toolCall('wait', '{}'), metadata());
  const failed = new Promise((resolve) => call.on('error', resolve));
  await new Promise((resolve) =>
    call.on('data', ({ result }) => {
      messages.push(result.value);
      resolve();
    }),
  );
  call.cancel();
  assert.equal(await aborted, 'AbortError');
  assert.equal((await failed).code, grpc.status.CANCELLED);
  assert.deepEqual(messages, ['"started"']);
});

test('serve on the unix socket a killed server left: serves, names it, and spares a live one', async () => {
  // Before the fresh-user trial a restart after a crash failed with EADDRINUSE (the Python kit
  // served), and `address` said `unix:1`.
  const folder = await mkdtemp(join(tmpdir(), 'kit-socket-'));
  const listen = `unix:${join(folder, 'kit.sock')}`;
  try {
    const killed = spawn(
      process.execPath,
      [
        '-e',
        "require('net').createServer().listen(process.argv[1], () => console.log('up'))",
        join(folder, 'kit.sock'),
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    await once(killed.stdout, 'data');
    killed.kill('SIGKILL'); // leaves its socket file behind
    await once(killed, 'exit');

    const restarted = await serve({ tools: TOOLS, listen });
    const client = new ToolsClient(listen, grpc.credentials.createInsecure());
    try {
      assert.equal(restarted.address, listen);
      assert.equal(restarted.port, 0);
      const { tools } = await unary(client, 'ListTools', {});
      assert.equal(tools.length, TOOLS.length);
      await assert.rejects(serve({ tools: TOOLS, listen }), /EADDRINUSE/); // live: not taken over
      assert.equal((await unary(client, 'ListTools', {})).tools.length, TOOLS.length);
    } finally {
      client.close();
      await restarted.close();
    }
  } finally {
    await rm(folder, { recursive: true, force: true });
  }
});
