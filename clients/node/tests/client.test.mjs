// @turnwire/client against a real `turnwire serve` process (test/sidecar.mjs):
// a chat whose scripted demo model calls a tool (plain JSON input and output),
// cancellation by AbortSignal, by leaving the iteration and by CancelChat (the
// turn ends ABORTED on the server), errors with their google.rpc details, and
// the other RPCs.
//
// Run: npm test -w @turnwire/client (after npm run build -w @turnwire/client), or `make test`.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import {
  ConcurrentInputStrategy,
  ERROR_DOMAIN,
  Role,
  TurnStatus,
  TurnwireClient,
  TurnwireError,
  messageSteps,
  messageToolCalls,
} from '@turnwire/client';

import { startSidecar, waitUntil } from './sidecar.mjs';

const WORDS = Array.from({ length: 100 }, (_, i) => `w${i}`);
const CONFIG = {
  providers: {
    scripted: {
      scripts: {
        // The words again and again, one every 50 ms, until the turn is cancelled: it never ends
        // before a cancel, however slow the machine.
        long: [{ text: WORDS.map((word) => `${word} `).join(''), delay_ms: 50, until_cancelled: true }],
        // Calls a tool the client offers and runs itself; `answer` continues after its result.
        locate: [
          {
            text: 'Asking your device.',
            tool_calls: [{ name: 'get_location', input: { precision: 'city' } }],
          },
        ],
        answer: [{ text: 'You are in Paris.' }],
        priced: [{ text: 'Priced.', usage: { input_tokens: 1000, output_tokens: 500 } }],
      },
    },
  },
  // $2 per million input tokens, $8 per million output: 1000 in and 500 out cost $0.006.
  pricing: { models: { 'scripted:priced': { input_mtok: 2.0, output_mtok: 8.0 } } },
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

/** The words of the stored assistant reply, or undefined while there is none. */
async function storedReplyWords(conversationId) {
  const conversation = await client.getConversation(conversationId);
  const reply = conversation.messages.findLast((message) => message.role === Role.ASSISTANT);
  return (
    reply &&
    messageSteps(reply)
      .map((step) => step.text)
      .join(' ')
      .split(/\s+/)
      .filter(Boolean)
  );
}

/** The TurnEnd status the server kept for a turn, read back with ResumeTurn. */
async function storedStatus(requestId) {
  return (await client.resumeTurn(requestId).collect()).status;
}

test('a chat whose model calls a tool: typed events, plain JSON input and output, text per step', async () => {
  const kinds = [];
  for await (const event of client.chat('ts-tool', 'What is 12 * 7?')) kinds.push(event.event.case);
  assert.equal(kinds[0], 'turnStart');
  assert.equal(kinds.at(-1), 'turnEnd');
  assert.ok(kinds.indexOf('toolInputAvailable') < kinds.indexOf('toolOutputAvailable'), kinds.join(' '));

  const result = await client.chat('ts-tool', 'And what is 6 * 7?').collect();
  assert.equal(result.status, 'COMPLETED');
  assert.equal(result.conversationId, 'ts-tool');
  assert.ok(result.requestId);
  assert.deepEqual(
    result.toolCalls.map(({ toolName, state, input, output }) => ({ toolName, state, input, output })),
    [
      {
        toolName: 'calculator',
        state: 'OUTPUT_AVAILABLE',
        input: { expression: '6 * 7' },
        output: { expression: '6 * 7', result: 42 },
      },
    ],
  );
  assert.deepEqual(
    result.steps.map((step) => step.finishReason),
    ['TOOL_CALLS', 'STOP'],
  );
  assert.deepEqual(result.steps[0].toolCallIds, [result.toolCalls[0].toolCallId]);
  assert.match(result.steps[1].text, /6 \* 7 = 42/);
  assert.equal(result.text, `${result.steps[0].text}\n\n${result.steps[1].text}`);
  assert.ok(result.usage.totalTokens > 0 && typeof result.usage.totalTokens === 'number');
  assert.equal(result.costUsd, undefined); // the scripted model has no price: unknown, never 0
  assert.equal(result.error, undefined);

  // The stored transcript: two user messages, two assistant replies; tool values as plain JSON.
  const conversation = await client.getConversation('ts-tool');
  assert.deepEqual(
    conversation.messages.map((message) => message.role),
    [Role.USER, Role.ASSISTANT, Role.USER, Role.ASSISTANT],
  );
  const stored = messageToolCalls(conversation.messages[3]);
  assert.deepEqual(
    stored.map((call) => call.output),
    [{ expression: '6 * 7', result: 42 }],
  );
  assert.equal(conversation.messages[3].id, result.message.id);
});

test("a turn's cost in US dollars, from the configured price", async () => {
  const result = await client.chat('ts-priced', 'How much?', { model: 'scripted:priced' }).collect();
  assert.equal(result.status, 'COMPLETED');
  assert.ok(Math.abs(result.costUsd - 0.006) < 1e-12, String(result.costUsd));
});

test('events the sidecar batched are handed out one by one, each once, in order', async () => {
  // The client asks for event batches (docs/semantics.md §10): the demo model's chunks come at
  // once, so several events share a message; ResumeTurn replays the stored stream one a message.
  const events = [];
  for await (const event of client.chat('ts-batches', 'What is 3 * 4?')) events.push(event);
  assert.deepEqual(
    events.map((event) => event.sequenceNumber),
    events.map((_, i) => BigInt(i + 1)),
  );
  const replayed = [];
  for await (const event of client.resumeTurn(events[0].requestId)) replayed.push(event);
  assert.deepEqual(
    events.map((event) => event.event.case),
    replayed.map((event) => event.event.case),
  );
});

/** The words of a reply of `scripted:long`: a start of its endless stream of WORDS. */
function assertStreamedWords(words) {
  assert.ok(words.length > 0, 'no words stored');
  assert.deepEqual(
    words,
    words.map((_, i) => WORDS[i % WORDS.length]),
  );
}

test('aborting the signal cancels the turn: the call ends CANCELLED, the server ends the turn ABORTED', async () => {
  const controller = new AbortController();
  const requestId = 'ts-abort-turn';
  const seen = [];
  await assert.rejects(
    async () => {
      for await (const event of client.chat('ts-abort', 'go', {
        model: 'scripted:long',
        requestId,
        signal: controller.signal,
      })) {
        seen.push(event.event.case);
        if (event.event.case === 'textDelta') controller.abort();
      }
    },
    (error) => error instanceof TurnwireError && error.code === 'CANCELLED',
  );
  assert.ok(!seen.includes('turnEnd'), seen.join(' '));
  // A cancelled turn stores its partial reply (the words streamed so far, in order) and the ABORTED
  // TurnEnd; the reply never ends on its own, so only the cancel ended it.
  const words = await waitUntil(() => storedReplyWords('ts-abort'), {
    timeoutMs: 10_000,
    what: 'the partial reply is stored',
  });
  assertStreamedWords(words);
  assert.equal(await storedStatus(requestId), 'ABORTED');
});

test('leaving the iteration early cancels the turn too', async () => {
  const requestId = 'ts-break-turn';
  for await (const event of client.chat('ts-break', 'go', { model: 'scripted:long', requestId })) {
    if (event.event.case === 'textDelta') break;
  }
  const words = await waitUntil(() => storedReplyWords('ts-break'), {
    timeoutMs: 10_000,
    what: 'the partial reply is stored',
  });
  assertStreamedWords(words);
  assert.equal(await storedStatus(requestId), 'ABORTED');
});

test('cancelChat ends a running turn ABORTED; the stream gets its TurnEnd', async () => {
  const requestId = 'ts-cancel-turn';
  const events = client
    .chat('ts-cancel', 'go', { model: 'scripted:long', requestId })
    [Symbol.asyncIterator]();
  const kinds = [];
  for (;;) {
    const { value } = await events.next();
    kinds.push(value.event.case);
    if (value.event.case === 'textDelta') break;
  }
  assert.equal(await client.cancelChat(requestId), true);
  let end;
  for (let next = await events.next(); !next.done; next = await events.next()) end = next.value;
  assert.equal(end.event.case, 'turnEnd');
  assert.equal(end.event.value.status, TurnStatus.ABORTED);
  assert.equal(await client.cancelChat(requestId), false, 'cancelling a finished turn is a no-op');
});

test('a client tool: the turn ends with the call pending; submitToolResults sends a plain JSON result and continues', async () => {
  const clientTools = [
    { name: 'get_location', description: "The user's location", inputSchema: { type: 'object' } },
  ];
  const pending = await client
    .chat('ts-client-tool', 'Where am I?', { model: 'scripted:locate', clientTools })
    .collect();
  assert.equal(pending.status, 'COMPLETED');
  const [call] = pending.toolCalls;
  assert.deepEqual(
    { toolName: call.toolName, state: call.state, input: call.input, clientExecuted: call.clientExecuted },
    {
      toolName: 'get_location',
      state: 'INPUT_AVAILABLE',
      input: { precision: 'city' },
      clientExecuted: true,
    },
  );

  const location = { city: 'Paris', lat: 48.8566, tags: ['capital', null] };
  const continued = await client
    .submitToolResults('ts-client-tool', [{ toolCallId: call.toolCallId, output: location }], {
      autoContinue: true,
      model: 'scripted:answer',
    })
    .collect();
  assert.equal(continued.status, 'COMPLETED');
  assert.equal(continued.text, 'You are in Paris.');
  const conversation = await client.getConversation('ts-client-tool');
  const stored = conversation.messages.flatMap(messageToolCalls);
  assert.deepEqual(
    stored.map(({ state, output }) => ({ state, output })),
    [{ state: 'OUTPUT_AVAILABLE', output: location }],
  );
});

test('concurrentInputStrategy: REJECT is refused with TURN_IN_PROGRESS, INTERRUPT stops the running turn', async () => {
  const requestId = 'ts-busy-turn';
  const events = client.chat('ts-busy', 'go', { model: 'scripted:long', requestId })[Symbol.asyncIterator]();
  for (let next = await events.next(); next.value.event.case !== 'textDelta'; next = await events.next());
  await assert.rejects(
    client.chat('ts-busy', 'again', { concurrentInputStrategy: ConcurrentInputStrategy.REJECT }).collect(),
    (error) => {
      assert.equal(error.code, 'FAILED_PRECONDITION');
      assert.equal(error.reason, 'TURN_IN_PROGRESS');
      assert.deepEqual(error.metadata, { running_request_id: requestId });
      return true;
    },
  );
  const interrupter = client
    .chat('ts-busy', 'instead', {
      model: 'scripted:answer',
      requestId: 'ts-busy-interrupter',
      concurrentInputStrategy: ConcurrentInputStrategy.INTERRUPT,
    })
    .collect();
  let end;
  for (let next = await events.next(); !next.done; next = await events.next()) end = next.value;
  assert.equal(end.event.value.status, TurnStatus.ABORTED);
  assert.equal((await interrupter).status, 'COMPLETED');
});

test('an invalid conversation id: INVALID_ARGUMENT with ErrorInfo and a field violation', async () => {
  const error = await client
    .chat('not a valid id!', 'hi')
    .collect()
    .then(
      () => assert.fail('the call succeeded'),
      (thrown) => thrown,
    );
  assert.ok(error instanceof TurnwireError, String(error));
  assert.equal(error.code, 'INVALID_ARGUMENT');
  assert.equal(error.grpcCode, 3);
  assert.equal(error.reason, 'INVALID_FIELD');
  assert.equal(error.domain, ERROR_DOMAIN);
  assert.deepEqual(
    error.fieldViolations.map((violation) => violation.field),
    ['conversation_id'],
  );
  assert.match(error.fieldViolations[0].description, /not a valid id/);
  assert.equal(error.retryDelayMs, undefined);
  assert.match(error.message, /^INVALID_ARGUMENT \[INVALID_FIELD\]: /);
});

test("a turn's own budget is sent: one the prompt exceeds ends the turn BUDGET_EXHAUSTED", async () => {
  // docs/cost.md, "Budgets": a request lowers its own turn budget; with none configured (as here)
  // it is the turn's limit. One token cannot hold the step's prompt: no step is sent.
  const result = await client
    .chat('ts-budget', 'hi', { model: 'scripted:answer', budget: { maxTokens: 1 } })
    .collect();
  assert.equal(result.status, 'ERROR');
  assert.equal(result.error?.reason, 'BUDGET_EXHAUSTED');
  assert.match(result.error?.message ?? '', /turn budget/);
  const free = await client.chat('ts-budget', 'hi', { model: 'scripted:answer' }).collect();
  assert.equal(free.status, 'COMPLETED');
});

test('an unknown conversation: NOT_FOUND with the reason and its metadata', async () => {
  await assert.rejects(client.getConversation('ts-nobody'), (error) => {
    assert.equal(error.code, 'NOT_FOUND');
    assert.equal(error.reason, 'CONVERSATION_NOT_FOUND');
    assert.deepEqual(error.metadata, { conversation_id: 'ts-nobody' });
    return true;
  });
});

test('continueLastTurn, listConversations, addMessages, deleteConversation', async () => {
  await client.chat('ts-rpcs', 'hello').collect();
  const continued = await client.continueLastTurn('ts-rpcs').collect();
  assert.equal(continued.status, 'COMPLETED');
  assert.equal(continued.events[0].event.value.continuation, true);

  const added = await client.addMessages({
    conversationId: 'ts-rpcs',
    messages: [
      { id: 'ts-note', role: Role.USER, parts: [{ kind: { case: 'text', value: { text: 'a note' } } }] },
    ],
  });
  assert.equal(added.addedCount, 1);

  const page = await client.listConversations({ pageSize: 1000 });
  assert.ok(page.conversations.some((conversation) => conversation.conversationId === 'ts-rpcs'));

  assert.equal(await client.deleteConversation('ts-rpcs'), true);
  assert.equal(await client.deleteConversation('ts-rpcs', { allowMissing: true }), false);
});

test('a sidecar that is not there: UNAVAILABLE', async () => {
  const nowhere = new TurnwireClient({ address: '127.0.0.1:1', timeoutMs: 5000 });
  try {
    await assert.rejects(
      nowhere.listConversations(),
      (error) => error instanceof TurnwireError && error.code === 'UNAVAILABLE',
    );
  } finally {
    nowhere.close();
  }
});
