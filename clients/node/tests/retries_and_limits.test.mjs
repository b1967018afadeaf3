// Issue 32 against a real `turnwire serve`: a failed turn retried by repeating the same call
// stores its question once (item 12); a request over the sidecar's message limit fails at once
// instead of hanging (item 14); an approval continues by default, as in the Python client, and
// its continuation names the tool it runs (items 15, 16).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { Role, TurnwireClient, messageToolCalls } from '@turnwire/client';

import { startSidecar } from './sidecar.mjs';

const CONFIG = {
  providers: {
    scripted: {
      scripts: {
        down: [{ error: { message: 'overloaded', status: 529 } }],
        done: [{ text: 'Done.' }],
        approval: [{ tool_calls: [{ name: 'calculator', input: { expression: '6*7' } }] }],
      },
    },
  },
  tools: { demo: true, require_approval: ['calculator'] },
};

let sidecar;
let client;

before(async () => {
  sidecar = await startSidecar(CONFIG);
  client = new TurnwireClient({ address: sidecar.address, timeoutMs: 10_000 });
});

after(async () => {
  client?.close();
  if (sidecar)
    assert.equal(await sidecar.stop(), 0, `turnwire exit code after SIGTERM${sidecar.stderrTail()}`);
});

test('repeating a failed chat under its request id retries it and stores the question once', async () => {
  const failed = await client.chat('ts-retry', 'q', { requestId: 'ts-r1', model: 'scripted:down' }).collect();
  assert.equal(failed.status, 'ERROR');
  const retried = await client
    .chat('ts-retry', 'q', { requestId: 'ts-r1', model: 'scripted:done' })
    .collect();
  assert.equal(retried.status, 'COMPLETED', retried.error?.message);
  const { messages } = await client.getConversation('ts-retry');
  assert.deepEqual(
    messages.map((message) => [message.role, message.id]),
    [
      [Role.USER, 'ts-r1.m0'],
      [Role.ASSISTANT, 'tw-a-ts-r1'],
    ],
  );
  // Without a request id of the caller's, the stream names the turn before any event.
  const stream = client.chat('ts-retry-2', 'q', { model: 'scripted:down' });
  assert.match(stream.requestId, /^r-[0-9a-f]{32}$/);
  assert.equal((await stream.collect()).status, 'ERROR');
  const again = await client.chat('ts-retry-2', 'q', { requestId: stream.requestId, model: 'scripted:done' });
  assert.equal((await again.collect()).status, 'COMPLETED');
  assert.equal((await client.getConversation('ts-retry-2')).messageCount, 2n);
});

// The timeout makes the old hang a failure instead of a stuck run.
test(
  'a message over the sidecar limit fails at once with RESOURCE_EXHAUSTED (it hung forever)',
  { timeout: 60_000 },
  async () => {
    const error = await client
      .chat('ts-big', 'y'.repeat(20 * 1024 * 1024))
      .collect()
      .then(
        () => assert.fail('a 20 MiB message was accepted'),
        (thrown) => thrown,
      );
    assert.equal(error.code, 'RESOURCE_EXHAUSTED', error.message);
    assert.match(error.message, /maxSendMessageBytes/);
    assert.match(error.message, /limits\.max_receive_message_bytes/);
    // The client's limit is an option: a lower sidecar limit is matched by a lower client one.
    const strict = new TurnwireClient({ address: sidecar.address, maxSendMessageBytes: 1024 });
    try {
      await assert.rejects(strict.chat('ts-big', 'y'.repeat(2048)).collect(), { code: 'RESOURCE_EXHAUSTED' });
    } finally {
      strict.close();
    }
  },
);

test('an approval continues by default: the approved tool runs, named, with no decision', async () => {
  const asked = await client.chat('ts-approve', '6*7?', { model: 'scripted:approval' }).collect();
  assert.equal(asked.status, 'COMPLETED');
  const [call] = asked.toolCalls;
  assert.equal(call.state, 'APPROVAL_REQUESTED');
  assert.equal(call.toolName, 'calculator');
  const continued = await client
    .submitToolApprovals('ts-approve', [{ toolCallId: call.toolCallId, approved: true }], {
      model: 'scripted:done',
    })
    .collect();
  assert.equal(
    continued.status,
    'COMPLETED',
    'the approval ran a continuation (autoContinue defaults to true)',
  );
  assert.deepEqual(
    continued.toolCalls.map(({ toolCallId, toolName, state, decision, output }) => ({
      toolCallId,
      toolName,
      state,
      decision,
      output,
    })),
    [
      {
        toolCallId: call.toolCallId,
        toolName: 'calculator',
        state: 'OUTPUT_AVAILABLE',
        decision: undefined,
        output: { expression: '6*7', result: 42 },
      },
    ],
  );
  assert.equal(continued.text, 'Done.');
  const { messages } = await client.getConversation('ts-approve');
  const stored = messages.flatMap(messageToolCalls);
  assert.deepEqual(
    stored.map(({ state, output }) => ({ state, output })),
    [{ state: 'OUTPUT_AVAILABLE', output: { expression: '6*7', result: 42 } }],
  );
});
