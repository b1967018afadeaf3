// TurnStream.collect() on hand-made event streams (no sidecar): the contract checks (gapless
// sequence numbers, one TurnEnd, last) and an appending AttemptStart, which only a crash
// recovery produces.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { create } from '@bufbuild/protobuf';
import { TurnStream, TurnStatus, messageSteps } from '@turnwire/client';
import { TurnEventSchema } from '@turnwire/client/gen/turnwire/v1/event_pb';
import { StatusSchema } from '@turnwire/client/gen/google/rpc/status_pb';
import { ErrorInfoSchema } from '@turnwire/client/gen/google/rpc/error_details_pb';
import { anyPack } from '@bufbuild/protobuf/wkt';

/** A TurnStream over events given as [case, value] pairs, numbered from `first`. */
function stream(events, first = 1) {
  const turnEvents = events.map(([kind, value], index) =>
    create(TurnEventSchema, {
      conversationId: 'c',
      requestId: 'r',
      sequenceNumber: BigInt(first + index),
      event: { case: kind, value },
    }),
  );
  return new TurnStream(async function* () {
    yield* turnEvents;
  });
}

const text = (value) => ({ parts: [{ kind: { case: 'text', value: { text: value } } }] });
const END = ['turnEnd', { status: TurnStatus.COMPLETED }];

test('the text of each step, the steps separated by a blank line; a blocked call marked', async () => {
  const result = await stream([
    ['turnStart', {}],
    ['stepStart', { stepNumber: 0 }],
    ['textDelta', { id: 't', delta: 'Hello' }],
    ['textDelta', { id: 't', delta: ' there.' }],
    ['toolInputAvailable', { toolCallId: 'k', toolName: 'rm', inputJson: '{"path":"/"}' }],
    ['toolOutputAvailable', { toolCallId: 'k', outputJson: '"not allowed"', decision: 1 }],
    ['stepStart', { stepNumber: 1 }],
    ['textDelta', { id: 'u', delta: 'Done.' }],
    END,
  ]).collect();
  assert.deepEqual(
    result.toolCalls.map(({ toolName, input, output, decision }) => ({ toolName, input, output, decision })),
    [{ toolName: 'rm', input: { path: '/' }, output: 'not allowed', decision: 'BLOCKED' }],
  );
  assert.deepEqual(result.steps[0].toolCallIds, ['k']);
  assert.deepEqual(
    result.steps.map((step) => step.text),
    ['Hello there.', 'Done.'],
  );
  assert.equal(result.text, 'Hello there.\n\nDone.');
  assert.equal(result.status, 'COMPLETED');
});

test('a call the provider ran is marked providerExecuted, from its events and its stored part', async () => {
  const search = { toolCallId: 'srvtoolu_1', toolName: 'web_search', providerExecuted: true };
  const result = await stream([
    ['turnStart', {}],
    ['stepStart', { stepNumber: 0 }],
    ['toolInputStart', search],
    ['toolInputAvailable', { ...search, inputJson: '{"query":"q"}' }],
    [
      'toolOutputAvailable',
      { toolCallId: 'srvtoolu_1', outputJson: '[{"url":"https://example.org"}]', providerExecuted: true },
    ],
    ['toolInputAvailable', { toolCallId: 'call_1', toolName: 'get_weather', inputJson: '{}' }],
    END,
  ]).collect();
  assert.deepEqual(
    result.toolCalls.map(({ toolCallId, providerExecuted, state }) => ({
      toolCallId,
      providerExecuted,
      state,
    })),
    [
      { toolCallId: 'srvtoolu_1', providerExecuted: true, state: 'OUTPUT_AVAILABLE' },
      { toolCallId: 'call_1', providerExecuted: false, state: 'INPUT_AVAILABLE' },
    ],
  );
});

test('an appending AttemptStart keeps the stored reply; one that does not starts again', async () => {
  const stored = {
    parts: [
      { kind: { case: 'stepStart', value: {} } },
      ...text('Partial').parts,
      {
        kind: {
          case: 'toolCall',
          value: {
            toolCallId: 'k',
            toolName: 'calculator',
            inputJson: '{"expression":"1+1"}',
            outputJson: '2',
            state: 5,
          },
        },
      },
    ],
  };
  const lost = [
    ['turnStart', {}],
    ['stepStart', { stepNumber: 0 }],
    ['textDelta', { id: 't', delta: 'Lost' }],
  ];
  const appended = await stream([
    ...lost,
    ['attemptStart', { attempt: 2, appends: true, message: stored }],
    ['stepStart', { stepNumber: 1 }],
    ['textDelta', { id: 'u', delta: 'Resumed.' }],
    END,
  ]).collect();
  assert.deepEqual(
    appended.steps.map((step) => step.text),
    ['Partial', 'Resumed.'],
  );
  assert.deepEqual(
    appended.toolCalls.map(({ input, output, state }) => ({ input, output, state })),
    [{ input: { expression: '1+1' }, output: 2, state: 'OUTPUT_AVAILABLE' }],
  );

  const restarted = await stream([
    ...lost,
    ['attemptStart', { attempt: 2, appends: false }],
    ['stepStart', { stepNumber: 0 }],
    ['textDelta', { id: 'u', delta: 'Again.' }],
    END,
  ]).collect();
  assert.equal(restarted.text, 'Again.');
  assert.deepEqual(restarted.toolCalls, []);
});

test('a stream that breaks the contract: INTERNAL', async () => {
  const broken = {
    'a gap in the sequence numbers': () =>
      new TurnStream(async function* () {
        yield create(TurnEventSchema, { sequenceNumber: 1n, event: { case: 'turnStart', value: {} } });
        yield create(TurnEventSchema, { sequenceNumber: 3n, event: { case: 'turnEnd', value: {} } });
      }).collect(),
    'an event after TurnEnd': () => stream([END, ['turnStart', {}]]).collect(),
    'no TurnEnd': () => stream([['turnStart', {}]]).collect(),
  };
  for (const [what, collect] of Object.entries(broken)) {
    await assert.rejects(
      collect,
      (error) => error.code === 'INTERNAL' && /broke the contract/.test(error.message),
      what,
    );
  }
});

test('a resumed stream may start at any sequence number', async () => {
  const result = await stream([['textDelta', { id: 't', delta: 'x' }], END], 42).collect();
  assert.equal(result.status, 'COMPLETED');
});

test('a call no hook decided has no decision; a continuation names the tools of calls it did not start', async () => {
  // Issue 32 item 16: `decision` was 'UNSPECIFIED' and `toolName` '' for the approved call a
  // continuation runs (its ToolInputStart was in the earlier turn's stream).
  const result = await stream([
    ['turnStart', {}],
    ['toolOutputAvailable', { toolCallId: 'a', toolName: 'calculator', outputJson: '42' }],
    ['toolOutputDenied', { toolCallId: 'b', toolName: 'transfer', reason: 'not now' }],
    ['stepStart', { stepNumber: 0 }],
    ['toolInputAvailable', { toolCallId: 'c', toolName: 'get_weather', inputJson: '{}' }],
    ['toolOutputError', { toolCallId: 'c', toolName: 'get_weather', errorText: 'down' }],
    END,
  ]).collect();
  assert.deepEqual(
    result.toolCalls.map(({ toolCallId, toolName, state, decision }) => ({
      toolCallId,
      toolName,
      state,
      decision,
    })),
    [
      { toolCallId: 'a', toolName: 'calculator', state: 'OUTPUT_AVAILABLE', decision: undefined },
      { toolCallId: 'b', toolName: 'transfer', state: 'OUTPUT_DENIED', decision: undefined },
      { toolCallId: 'c', toolName: 'get_weather', state: 'OUTPUT_ERROR', decision: undefined },
    ],
  );
});

test('why a turn ended ABORTED or INTERRUPTED is in result.error, as for ERROR', async () => {
  const status = create(StatusSchema, {
    code: 10,
    message: 'the model stream stalled',
    details: [
      anyPack(ErrorInfoSchema, create(ErrorInfoSchema, { reason: 'STREAM_STALLED', domain: 'turnwire.dev' })),
    ],
  });
  for (const ended of [TurnStatus.ABORTED, TurnStatus.INTERRUPTED]) {
    const result = await stream([
      ['turnStart', {}],
      ['turnEnd', { status: ended, error: status }],
    ]).collect();
    assert.equal(result.error?.reason, 'STREAM_STALLED', TurnStatus[ended]);
    assert.equal(result.error?.code, 'ABORTED');
  }
  const completed = await stream([['turnStart', {}], END]).collect();
  assert.equal(completed.error, undefined);
});

test('messageSteps gives step objects, as collect() does', () => {
  const message = {
    parts: [
      { kind: { case: 'stepStart', value: {} } },
      { kind: { case: 'reasoning', value: { text: 'Think.' } } },
      { kind: { case: 'text', value: { text: 'One.' } } },
      { kind: { case: 'toolCall', value: { toolCallId: 'k', toolName: 'calculator' } } },
      { kind: { case: 'stepStart', value: {} } },
      { kind: { case: 'text', value: { text: 'Two.' } } },
    ],
  };
  assert.deepEqual(
    messageSteps(message).map(({ stepNumber, text, reasoning, toolCallIds }) => ({
      stepNumber,
      text,
      reasoning,
      toolCallIds,
    })),
    [
      { stepNumber: 0, text: 'One.', reasoning: 'Think.', toolCallIds: ['k'] },
      { stepNumber: 1, text: 'Two.', reasoning: '', toolCallIds: [] },
    ],
  );
});

test('each step keeps the sources it cited and the files it produced (issue 31)', async () => {
  const source = {
    sourceId: 's1',
    url: 'https://example.com/t',
    citedText: 'It is 330 metres tall.',
    textId: 't',
  };
  const file = {
    mediaType: 'image/png',
    content: { case: 'providerFileId', value: 'file_1' },
    sizeBytes: 9n,
  };
  const result = await stream([
    ['turnStart', {}],
    ['stepStart', { stepNumber: 0 }],
    ['textDelta', { id: 't', delta: '330 m.' }],
    ['source', source],
    ['file', file],
    END,
  ]).collect();
  assert.deepEqual(
    result.steps[0].sources.map(({ url, citedText, textId }) => ({ url, citedText, textId })),
    [{ url: 'https://example.com/t', citedText: 'It is 330 metres tall.', textId: 't' }],
  );
  assert.deepEqual(
    result.files.map(({ mediaType, content, sizeBytes }) => ({ mediaType, id: content.value, sizeBytes })),
    [{ mediaType: 'image/png', id: 'file_1', sizeBytes: 9n }],
  );
  assert.equal(result.sources.length, 1);
});
