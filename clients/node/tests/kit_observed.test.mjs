// @turnwire/client/kit: deciding hooks and the turn's end hooks declared observed (`hooks(handlers,
// {observe})`, hooks.proto GetHookSubscriptionsResponse.observed_hooks), against a grpc-js client
// playing the sidecar: they are listed as observed_hooks in Hook order; one that returns a change
// (onChatError: a surfaced error) is still called but answered empty, on its unary RPC and on
// HookSession, with one warning per hook; its thrown error still fails the call; hooks not declared
// observed answer as before; an `observe` entry that is no hook you can observe, or has no
// handler, is refused at start.
//
// Run: npm test -w @turnwire/client (after npm run build -w @turnwire/client), or `make test`.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import * as grpc from '@grpc/grpc-js';
import { Hook, PARENT_REQUEST_ID, TURN_HOOKS_SERVICE, block, hooks, serve } from '@turnwire/client/kit';

/** The step numbers the observed beforeStep handler got, in order. */
const steps = [];
/** The calls the observed end hooks got, in order: [hook, request id]. */
const ends = [];

const HooksClient = grpc.makeGenericClientConstructor(TURN_HOOKS_SERVICE, 'TurnHooksService');
let served;
let client;

before(async () => {
  const hookServer = hooks(
    {
      beforeTurn: (request) => ({ system: `${request.system}!` }), // deciding, not observed
      beforeStep({ stepNumber }) {
        steps.push(stepNumber);
        if (stepNumber === 9) throw new Error('step store unreachable');
        return stepNumber === 0 ? undefined : { system: 'ignored', maxStepTokens: 10n };
      },
      beforeToolCall: () => block('ignored too'),
      afterToolCall() {},
      onChatResponse({ turn }) {
        ends.push(['onChatResponse', turn.requestId]);
      },
      onChatError({ failure }) {
        ends.push(['onChatError', failure.turn.requestId]);
        if (failure.stage === 'persist') throw new Error('error store unreachable');
        // A surfaced error, but for a failure in `parse`: nothing (no change, no warning).
        if (failure.stage !== 'parse') return { message: 'ignored', error: { code: 14, message: 'retry' } };
      },
    },
    // Given out of Hook order, and twice: answered once each, in Hook order.
    { observe: ['onChatError', 'beforeToolCall', 'beforeStep', 'onChatResponse', 'beforeToolCall'] },
  );
  served = await serve({ hooks: hookServer, listen: '127.0.0.1:0' });
  client = new HooksClient(served.address, grpc.credentials.createInsecure());
});

after(async () => {
  client.close();
  await served.close();
});

/** The empty responses, as the client decodes them (nothing set). */
const EMPTY_STEP = { $typeName: 'turnwire.v1.BeforeStepResponse' };
const EMPTY_TOOL_CALL = { $typeName: 'turnwire.v1.BeforeToolCallResponse', decision: { case: undefined } };
const EMPTY_CHAT_ERROR = { $typeName: 'turnwire.v1.OnChatErrorResponse' };
const EMPTY_CHAT_RESPONSE = { $typeName: 'turnwire.v1.OnChatResponseResponse' };

const turn = { conversationId: 'c-1', requestId: 'r-1', body: {}, attempt: 1 };

function metadata() {
  const m = new grpc.Metadata();
  m.set(PARENT_REQUEST_ID, 'r-1');
  return m;
}

function unary(rpc, request) {
  return new Promise((resolve, reject) =>
    client[rpc](request, metadata(), (error, response) => (error ? reject(error) : resolve(response))),
  );
}

/** One HookSession request of `calls`; resolves with the stream's answers once it ended. */
async function sessionAnswers(calls) {
  const stream = client.HookSession(metadata());
  const answers = [];
  const ended = new Promise((resolve, reject) => {
    stream.on('data', (response) => answers.push(...response.answers));
    stream.on('error', reject);
    stream.on('end', resolve);
  });
  stream.write({ calls });
  stream.end();
  await ended;
  return answers;
}

test('the observed hooks are listed as observed_hooks, in Hook order', async () => {
  const answer = await unary('GetHookSubscriptions', {});
  assert.deepEqual(answer.hooks, [
    Hook.BEFORE_TURN,
    Hook.BEFORE_STEP,
    Hook.BEFORE_TOOL_CALL,
    Hook.AFTER_TOOL_CALL,
    Hook.ON_CHAT_RESPONSE,
    Hook.ON_CHAT_ERROR,
  ]);
  assert.deepEqual(answer.observedHooks, [
    Hook.BEFORE_STEP,
    Hook.BEFORE_TOOL_CALL,
    Hook.ON_CHAT_RESPONSE,
    Hook.ON_CHAT_ERROR,
  ]);
  assert.deepEqual(answer.observedHooks, [2, 3, 7, 9]); // their numbers on the wire
});

test('an observed hook that returns a change is answered empty, unary and on HookSession, warned once', async (t) => {
  const warned = t.mock.method(console, 'warn', () => {});
  const logged = t.mock.method(console, 'error', () => {}); // the failing call's stack
  // Unary: the handler runs, its change is not sent.
  assert.deepEqual(await unary('BeforeStep', { turn, stepNumber: 1 }), EMPTY_STEP);
  assert.deepEqual(await unary('BeforeToolCall', { turn, call: { toolName: 'x' } }), EMPTY_TOOL_CALL);
  // A hook not declared observed still answers its change.
  assert.equal((await unary('BeforeTurn', { turn, system: 'S' })).system, 'S!');
  // A thrown error still fails the call.
  await assert.rejects(unary('BeforeStep', { turn, stepNumber: 9 }), {
    code: grpc.status.UNKNOWN,
    details: 'step store unreachable',
  });

  const answers = await sessionAnswers([
    { id: 1n, hook: { case: 'beforeStep', value: { turn, stepNumber: 2 } } },
    { id: 2n, hook: { case: 'beforeStep', value: { turn, stepNumber: 0 } } }, // no change
    { id: 3n, hook: { case: 'beforeToolCall', value: { turn, call: { toolName: 'x' } } } },
    { id: 4n, hook: { case: 'beforeTurn', value: { turn, system: 'T' } } },
    { id: 5n, hook: { case: 'beforeStep', value: { turn, stepNumber: 9 } } },
  ]);
  assert.deepEqual(
    answers.map(({ id, hook }) => [id, hook.case]),
    [
      [1n, 'beforeStep'],
      [2n, 'beforeStep'],
      [3n, 'beforeToolCall'],
      [4n, 'beforeTurn'],
      [5n, undefined],
    ],
  );
  assert.deepEqual(answers[0].hook.value, EMPTY_STEP);
  assert.deepEqual(answers[1].hook.value, EMPTY_STEP);
  assert.deepEqual(answers[2].hook.value, EMPTY_TOOL_CALL);
  assert.equal(answers[3].hook.value.system, 'T!');
  assert.deepEqual(
    [answers[4].error.code, answers[4].error.message],
    [grpc.status.UNKNOWN, 'step store unreachable'],
  );

  assert.deepEqual(steps, [1, 9, 2, 0, 9]); // every call reached the handler
  assert.equal(logged.mock.callCount(), 2);
  // One warning per observed hook that returned a change, for all its calls on both paths.
  assert.deepEqual(
    warned.mock.calls.map(({ arguments: [message] }) => message),
    [
      'turnwire kit: hook beforeStep is observed (hooks() option observe): its answer is ignored',
      'turnwire kit: hook beforeToolCall is observed (hooks() option observe): its answer is ignored',
    ],
  );
});

test('an observed onChatError that surfaces an error is answered empty, unary and on HookSession, warned once', async (t) => {
  const warned = t.mock.method(console, 'warn', () => {});
  const logged = t.mock.method(console, 'error', () => {}); // the failing call's stack
  const failure = (requestId, stage) => ({
    turn: { ...turn, requestId },
    error: { code: 13, message: 'boom' },
    stage,
  });
  ends.length = 0;
  // No change: answered empty, no warning.
  assert.deepEqual(await unary('OnChatError', { failure: failure('r-1', 'parse') }), EMPTY_CHAT_ERROR);
  assert.equal(warned.mock.callCount(), 0);
  // A surfaced error: the handler runs, its error is not sent.
  assert.deepEqual(await unary('OnChatError', { failure: failure('r-2', 'turn') }), EMPTY_CHAT_ERROR);
  assert.deepEqual(await unary('OnChatResponse', { turn }), EMPTY_CHAT_RESPONSE);
  // A thrown error still fails the call.
  await assert.rejects(unary('OnChatError', { failure: failure('r-3', 'persist') }), {
    code: grpc.status.UNKNOWN,
    details: 'error store unreachable',
  });

  const answers = await sessionAnswers([
    { id: 1n, hook: { case: 'onChatResponse', value: { turn } } },
    { id: 2n, hook: { case: 'onChatError', value: { failure: failure('r-4', 'step') } } },
    { id: 3n, hook: { case: 'onChatError', value: { failure: failure('r-5', 'persist') } } },
  ]);
  assert.deepEqual(
    answers.map(({ id, hook }) => [id, hook.case]),
    [
      [1n, 'onChatResponse'],
      [2n, 'onChatError'],
      [3n, undefined],
    ],
  );
  assert.deepEqual(answers[0].hook.value, EMPTY_CHAT_RESPONSE);
  assert.deepEqual(answers[1].hook.value, EMPTY_CHAT_ERROR);
  assert.deepEqual(
    [answers[2].error.code, answers[2].error.message],
    [grpc.status.UNKNOWN, 'error store unreachable'],
  );

  // Every call reached its handler, in order.
  assert.deepEqual(ends, [
    ['onChatError', 'r-1'],
    ['onChatError', 'r-2'],
    ['onChatResponse', 'r-1'],
    ['onChatError', 'r-3'],
    ['onChatResponse', 'r-1'],
    ['onChatError', 'r-4'],
    ['onChatError', 'r-5'],
  ]);
  assert.equal(logged.mock.callCount(), 2);
  // One warning for onChatError's surfaced errors on both paths; none for onChatResponse.
  assert.deepEqual(
    warned.mock.calls.map(({ arguments: [message] }) => message),
    ['turnwire kit: hook onChatError is observed (hooks() option observe): its answer is ignored'],
  );
});

test('an observe entry that is no hook you can observe, or has no handler, is refused at start', () => {
  const beforeStep = () => undefined;
  for (const name of ['afterToolCall', 'classifyChatError', 'onStepFinish', 'onChunks', 'beforestep']) {
    assert.throws(() => hooks({ beforeStep, afterToolCall() {} }, { observe: [name] }), {
      name: 'TypeError',
      message:
        `hooks(): observe: "${name}" is not a hook you can observe ` +
        '(one of beforeTurn, beforeStep, beforeToolCall, onChatResponse, onChatError)' +
        (['afterToolCall', 'onStepFinish', 'onChunks'].includes(name)
          ? '; the sidecar never waits for it on a HookSession anyway'
          : ''),
    });
  }
  // The end hooks are refused without their handler too.
  for (const name of ['onChatResponse', 'onChatError']) {
    assert.throws(() => hooks({ beforeStep }, { observe: [name] }), {
      name: 'TypeError',
      message: `hooks(): observe: "${name}" has no handler`,
    });
  }
  assert.throws(() => hooks({ beforeStep }, { observe: ['beforeStep', 'beforeTurn'] }), {
    name: 'TypeError',
    message: 'hooks(): observe: "beforeTurn" has no handler',
  });
  assert.throws(() => hooks({ beforeStep, beforeTurn: undefined }, { observe: ['beforeTurn'] }), {
    message: 'hooks(): observe: "beforeTurn" has no handler',
  });
});
