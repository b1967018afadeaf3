// @turnwire/client/kit: a turn's OnChunks batches as HookSession calls (hooks.proto
// HookSessionRequest, OnChunksRequest.last), against a grpc-js client playing the sidecar: the
// batches reach one onChunks handler per turn in order; a batch is answered before the handler
// read it and the session goes on; the last batch once the handler returned (its failure as the
// answer's error); a batch after the last starts a new handler; at most 4096 events wait; a
// stream that ends or is cancelled before a turn's last batch cancels that handler (its signal
// aborts, its input fails).
//
// Run: npm test -w @turnwire/client (after npm run build -w @turnwire/client), or `make test`.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import * as grpc from '@grpc/grpc-js';
import { PARENT_REQUEST_ID, TURN_HOOKS_SERVICE, hooks, serve } from '@turnwire/client/kit';

import { waitUntil } from './sidecar.mjs';

/** The onChunks handler of the test that runs (each test sets its own). */
let onChunks;

const HooksClient = grpc.makeGenericClientConstructor(TURN_HOOKS_SERVICE, 'TurnHooksService');
let served;
let client;
let withoutChunks; // a server without an onChunks handler
let withoutChunksClient;

before(async () => {
  const beforeTurn = (request) => ({ system: `${request.system}!` });
  served = await serve({
    hooks: hooks({ beforeTurn, onChunks: (batches, context) => onChunks(batches, context) }),
    listen: '127.0.0.1:0',
  });
  client = new HooksClient(served.address, grpc.credentials.createInsecure());
  withoutChunks = await serve({ hooks: hooks({ beforeTurn }), listen: '127.0.0.1:0' });
  withoutChunksClient = new HooksClient(withoutChunks.address, grpc.credentials.createInsecure());
});

after(async () => {
  client.close();
  withoutChunksClient.close();
  await served.close();
  await withoutChunks.close();
});

const turn = (requestId) => ({ conversationId: 'c-1', requestId, body: {}, attempt: 1 });
const delta = (text) => ({ event: { case: 'textDelta', value: { delta: text } } });
const TRACEPARENT = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';

/** A HookCall of OnChunks for turn `parent` (the sidecar always names the call's turn). */
function chunkCall(id, parent, batch) {
  return { id: BigInt(id), parentRequestId: parent, hook: { case: 'onChunks', value: batch } };
}

function beforeTurnCall(id, parent) {
  return {
    id: BigInt(id),
    parentRequestId: parent,
    hook: { case: 'beforeTurn', value: { turn: turn(parent), system: 'S' } },
  };
}

/** A deferred: `promise` resolves when `release()` is called. */
function gate() {
  let release;
  const promise = new Promise((resolve) => (release = resolve));
  return { promise, release };
}

/**
 * A HookSession of `on` (the kit's client): `answer(id)` waits for the call's answer; each answer
 * arrives with `state()` as it was then (what the handler had done), in `arrivals`.
 */
function openSession(on, state = () => ({})) {
  const metadata = new grpc.Metadata();
  metadata.set(PARENT_REQUEST_ID, 'r-0'); // the stream's first turn: each call names its own
  const stream = on.HookSession(metadata);
  const answers = new Map();
  const arrivals = [];
  const ended = new Promise((resolve, reject) => {
    stream.on('data', (response) => {
      for (const answer of response.answers) {
        answers.set(answer.id, answer);
        arrivals.push({ id: answer.id, ...state() });
      }
    });
    stream.on('error', reject);
    stream.on('end', resolve);
  });
  const answer = (id) => waitUntil(() => answers.get(BigInt(id)), { what: `the answer to call ${id}` });
  return { stream, answer, arrivals, ended };
}

test("a turn's batches reach its handler in order, answered unread; the last once it returned", async () => {
  const blocked = gate();
  const finishing = gate();
  const handler = { read: 0, returned: false };
  onChunks = async (batches, context) => {
    handler.context = context;
    handler.kinds = [];
    await blocked.promise;
    for await (const batch of batches) {
      handler.read += 1;
      handler.turn ??= batch.turn?.requestId;
      handler.kinds.push(...batch.events.map(({ event }) => event.value.delta ?? event.case));
    }
    handler.inputEnded = true;
    await finishing.promise;
    handler.returned = true;
  };
  const session = openSession(client, () => ({ read: handler.read, returned: handler.returned }));
  session.stream.write({
    calls: [
      {
        ...chunkCall(1, 'r-1', {
          turn: turn('r-1'),
          events: [{ event: { case: 'stepStart', value: {} } }, delta('a')],
        }),
        traceContext: { traceparent: TRACEPARENT },
      },
    ],
  });
  assert.equal((await session.answer(1)).hook.case, 'onChunks');
  // The handler is still blocked, its batch unread: the session goes on with the turn's next calls.
  session.stream.write({ calls: [beforeTurnCall(2, 'r-1')] });
  assert.equal((await session.answer(2)).hook.value.system, 'S!');
  session.stream.write({ calls: [chunkCall(3, 'r-1', { events: [delta('b')] })] });
  await session.answer(3);
  // The last batch (no events of its own here), then a later call of the turn on the same request.
  session.stream.write({
    calls: [chunkCall(4, 'r-1', { events: [], last: true }), beforeTurnCall(5, 'r-1')],
  });
  blocked.release();
  // The handler saw its input end after the three batches and has not returned yet: no answer.
  await waitUntil(() => handler.inputEnded, { what: "the handler's input ending" });
  assert.equal(session.arrivals.length, 3);
  finishing.release();
  await session.answer(5);
  session.stream.end();
  await session.ended;

  assert.deepEqual(
    session.arrivals,
    [
      { id: 1n, read: 0, returned: false },
      { id: 2n, read: 0, returned: false },
      { id: 3n, read: 0, returned: false },
      { id: 4n, read: 3, returned: true },
      { id: 5n, read: 3, returned: true },
    ],
    'batches answered unread; the last one, and the call after it, once the handler returned',
  );
  assert.deepEqual(handler.kinds, ['stepStart', 'a', 'b']);
  assert.equal(handler.turn, 'r-1');
  // The context of the turn's first batch call (the stream's metadata names another turn, r-0).
  assert.equal(handler.context.parentRequestId, 'r-1');
  assert.equal(handler.context.metadata.get(PARENT_REQUEST_ID)[0], 'r-1');
  assert.equal(handler.context.traceContext.traceparent, TRACEPARENT);
});

test("a batch after the turn's last starts a new handler; each turn of the stream has its own", async () => {
  const runs = [];
  onChunks = async (batches, { parentRequestId }) => {
    const run = { parentRequestId, texts: [] };
    runs.push(run);
    for await (const batch of batches) run.texts.push(...batch.events.map(({ event }) => event.value.delta));
  };
  const session = openSession(client);
  session.stream.write({
    calls: [
      chunkCall(1, 'r-1', { turn: turn('r-1'), events: [delta('a')] }),
      chunkCall(2, 'r-2', { turn: turn('r-2'), events: [delta('x')] }),
      chunkCall(3, 'r-1', { events: [delta('b')], last: true }),
      // An attempt recovered after the turn's last step: a new OnChunks handler, as a new call.
      chunkCall(4, 'r-1', { events: [delta('c')], last: true }),
      chunkCall(5, 'r-2', { events: [delta('y')], last: true }),
    ],
  });
  session.stream.end();
  await session.ended;
  assert.deepEqual(
    session.arrivals.map(({ id }) => id),
    [1n, 2n, 3n, 4n, 5n],
  );
  assert.deepEqual(runs, [
    { parentRequestId: 'r-1', texts: ['a', 'b'] },
    { parentRequestId: 'r-2', texts: ['x', 'y'] },
    { parentRequestId: 'r-1', texts: ['c'] },
  ]);
});

test("a failed handler: the last batch's answer is its error, as the OnChunks RPC's status", async (t) => {
  const logged = t.mock.method(console, 'error', () => {});
  onChunks = async (batches, { parentRequestId }) => {
    for await (const batch of batches) if (batch.events.length === 0) break;
    if (parentRequestId === 'r-1') throw new Error('the sink is down');
    throw Object.assign(new Error('not this turn'), { code: grpc.status.PERMISSION_DENIED });
  };
  const session = openSession(client);
  session.stream.write({
    calls: [
      chunkCall(1, 'r-1', { turn: turn('r-1'), events: [] }), // the handler fails on reading it
      chunkCall(2, 'r-1', { events: [delta('a')], last: true }),
      chunkCall(3, 'r-2', { turn: turn('r-2'), events: [], last: true }),
      beforeTurnCall(4, 'r-2'),
    ],
  });
  session.stream.end();
  await session.ended;
  const answers = session.arrivals.map(({ id }) => id);
  assert.deepEqual(answers, [1n, 2n, 3n, 4n]);
  const [first, last, denied, next] = await Promise.all(answers.map((id) => session.answer(id)));
  assert.equal(first.hook.case, 'onChunks'); // queued: answered before the handler failed
  assert.deepEqual([last.error.code, last.error.message], [grpc.status.UNKNOWN, 'the sink is down']);
  assert.deepEqual(
    [denied.error.code, denied.error.message],
    [grpc.status.PERMISSION_DENIED, 'not this turn'],
  );
  assert.equal(next.hook.value.system, 'S!');
  // Logged as the RPC logs it: the unexpected failure, not the deliberate refusal.
  assert.equal(logged.mock.callCount(), 1);
  assert.equal(logged.mock.calls[0].arguments[0], 'turnwire kit: hook onChunks failed:');
});

test('without an onChunks handler a batch is answered UNIMPLEMENTED', async () => {
  const session = openSession(withoutChunksClient);
  session.stream.write({
    calls: [
      chunkCall(1, 'r-1', { turn: turn('r-1'), events: [delta('a')], last: true }),
      beforeTurnCall(2, 'r-1'),
    ],
  });
  session.stream.end();
  await session.ended;
  const [unimplemented, next] = [await session.answer(1), await session.answer(2)];
  assert.deepEqual(
    [unimplemented.error.code, unimplemented.error.message],
    [grpc.status.UNIMPLEMENTED, 'OnChunks is not implemented by this server'],
  );
  assert.equal(next.hook.value.system, 'S!');
});

test('at most 4096 events wait for a blocked handler: those beyond are dropped, logged once', async (t) => {
  const warned = t.mock.method(console, 'warn', () => {});
  const blocked = gate();
  const texts = [];
  onChunks = async (batches) => {
    await blocked.promise;
    for await (const batch of batches) texts.push(...batch.events.map(({ event }) => event.value.delta));
  };
  const events = (from, count) => Array.from({ length: count }, (_, i) => delta(String(from + i)));
  const session = openSession(client);
  session.stream.write({
    calls: [
      chunkCall(1, 'r-1', { turn: turn('r-1'), events: events(0, 3000) }),
      chunkCall(2, 'r-1', { events: events(3000, 3000) }), // 1096 fit
      chunkCall(3, 'r-1', { events: events(6000, 10) }), // none fit
      beforeTurnCall(4, 'r-1'),
    ],
  });
  await session.answer(4); // the stream still answers, the handler still blocked
  assert.equal(texts.length, 0);
  blocked.release();
  session.stream.write({ calls: [chunkCall(5, 'r-1', { events: [], last: true })] });
  await session.answer(5);
  session.stream.end();
  await session.ended;
  assert.equal(texts.length, 4096);
  assert.deepEqual([texts[0], texts.at(-1)], ['0', '4095']);
  assert.equal(warned.mock.callCount(), 1);
  assert.match(warned.mock.calls[0].arguments[0], /onChunks of turn r-1 reads too slowly/);
});

test("a stream that ends or is cancelled before a turn's last batch cancels its handler", async () => {
  const handlers = [];
  onChunks = async (batches, { parentRequestId, signal }) => {
    const handler = { parentRequestId, texts: [] };
    handlers.push(handler);
    try {
      for await (const batch of batches)
        handler.texts.push(...batch.events.map(({ event }) => event.value.delta));
    } catch (error) {
      handler.failed = error.name;
    }
    handler.aborted = signal.aborted;
  };
  const ending = openSession(client);
  ending.stream.write({ calls: [chunkCall(1, 'r-1', { turn: turn('r-1'), events: [delta('a')] })] });
  await ending.answer(1);
  ending.stream.end();
  await ending.ended;
  const ended = await waitUntil(() => handlers[0]?.failed && handlers[0], {
    what: 'the first handler failing',
  });
  assert.deepEqual(ended, { parentRequestId: 'r-1', texts: ['a'], failed: 'AbortError', aborted: true });

  const cancelled = openSession(client);
  cancelled.ended.catch(() => {}); // the client's own cancel
  cancelled.stream.write({ calls: [chunkCall(1, 'r-2', { turn: turn('r-2'), events: [delta('b')] })] });
  await cancelled.answer(1);
  cancelled.stream.cancel();
  const aborted = await waitUntil(() => handlers[1]?.failed && handlers[1], {
    what: 'the second handler failing',
  });
  assert.deepEqual(aborted, { parentRequestId: 'r-2', texts: ['b'], failed: 'AbortError', aborted: true });
});
