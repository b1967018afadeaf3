// End-to-end test of the Turnwire sidecar from Node.js: spawns `turnwire serve`
// on a free port with a throwaway SQLite store, talks to it with
// @grpc/grpc-js + @grpc/proto-loader, and checks the streamed events, the
// stored conversation and the rich error details of a rejected request.
//
// Run: node --test tests/node/     (TURNWIRE_BIN overrides the server command)

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const require = createRequire(import.meta.url);
// protobufjs is proto-loader's own dependency; resolve it from there.
const protobuf = createRequire(require.resolve('@grpc/proto-loader'))('protobufjs');

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const PROTOS = path.join(REPO, 'protos');
const TURNWIRE_BIN = process.env.TURNWIRE_BIN || path.join(REPO, '.venv', 'bin', 'turnwire');
// A deadline, not a speed target: a loaded 2-core CI has taken over 30 s to start a sidecar.
const STARTUP_TIMEOUT_MS = 60_000;
const CALL_TIMEOUT_MS = 10_000;
const QUESTION = "What's the weather in Paris?";

// keepCase: false everywhere: fields are lowerCamelCase (conversationId,
// turnEnd, toolInputAvailable); oneofs: true adds a virtual property naming
// the set member (TurnEvent.event, Part.kind, Value.kind).
const LOADER_OPTIONS = {
  includeDirs: [PROTOS],
  keepCase: false,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

let server; // ChildProcess
let serverExit; // Promise<{code, signal}>
let serverStderr = '';
let tmpDir;
let client;
let turnwire; // the loaded turnwire.v1 package

// ---------------------------------------------------------------- helpers

function stderrTail() {
  const tail = serverStderr.slice(-4000);
  return tail ? `\n--- turnwire stderr (tail) ---\n${tail}` : '\n(turnwire wrote nothing to stderr)';
}

function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.unref();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const deadline = (ms) => new Date(Date.now() + ms);

function unary(method, request, timeoutMs = CALL_TIMEOUT_MS) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: deadline(timeoutMs) }, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });
}

/** Runs a server-streaming call to its end; resolves with every response. */
function collect(method, request, timeoutMs = CALL_TIMEOUT_MS) {
  return new Promise((resolve, reject) => {
    const responses = [];
    const call = client[method](request, { deadline: deadline(timeoutMs) });
    call.on('data', (response) => responses.push(response));
    call.on('error', reject);
    call.on('end', () => resolve(responses));
  });
}

/** google.protobuf.Value as proto-loader decodes it ({kind, <kind>: …}) → plain JS. */
function fromValue(value) {
  if (value == null) return undefined;
  switch (value.kind) {
    case 'nullValue':
      return null;
    case 'numberValue':
    case 'stringValue':
    case 'boolValue':
      return value[value.kind];
    case 'structValue':
      return fromStruct(value.structValue);
    case 'listValue':
      return (value.listValue.values ?? []).map(fromValue);
    default:
      throw new Error(`google.protobuf.Value without a kind: ${JSON.stringify(value)}`);
  }
}

/** google.protobuf.Struct as proto-loader decodes it ({fields: {k: Value}}) → plain object. */
function fromStruct(struct) {
  if (struct == null) return undefined;
  return Object.fromEntries(Object.entries(struct.fields ?? {}).map(([k, v]) => [k, fromValue(v)]));
}

// google.rpc.Status comes from the vendored proto; BadRequest and ErrorInfo
// (google/rpc/error_details.proto) are not vendored, so their two messages
// are declared here with the upstream field numbers.
const rpcRoot = new protobuf.Root();
rpcRoot.resolvePath = (_origin, target) =>
  target.startsWith('google/protobuf/') ? target : path.join(PROTOS, target);
const rpcRootLoaded = rpcRoot.load('google/rpc/status.proto').then((root) => {
  protobuf.parse(
    `syntax = "proto3";
     package google.rpc;
     message ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }
     message BadRequest {
       message FieldViolation { string field = 1; string description = 2; }
       repeated FieldViolation field_violations = 1;
     }`,
    root,
  );
  return root;
});

async function decodeStatusDetails(metadata) {
  const [raw] = metadata.get('grpc-status-details-bin');
  assert.ok(Buffer.isBuffer(raw), 'the error has a grpc-status-details-bin trailer');
  const root = await rpcRootLoaded;
  const Status = root.lookupType('google.rpc.Status');
  // Work on the decoded message, not Status.toObject(): protobufjs' toObject
  // rewrites a google.protobuf.Any whose type it knows into {"@type", ...}.
  const status = Status.decode(raw);
  const details = status.details.map((detail) => {
    // The bundled google.protobuf.Any is a JSON descriptor, so its field keeps
    // the proto name type_url (no camelCase conversion, unlike parsed .proto files).
    const any = { typeUrl: detail.type_url ?? detail.typeUrl, value: detail.value };
    const typeName = any.typeUrl.replace(/^type\.googleapis\.com\//, '');
    const Type = root.lookup(typeName);
    if (!(Type instanceof protobuf.Type)) return { typeUrl: any.typeUrl, value: null }; // not declared here
    return { typeUrl: any.typeUrl, value: Type.toObject(Type.decode(any.value), { defaults: true }) };
  });
  return { code: status.code, message: status.message, details };
}

// One turn shared by the stream and the history tests; started lazily so
// either test also works alone (--test-name-pattern).
const CONVERSATION_ID = `node-e2e-${process.pid}`;
let firstTurn;
function runFirstTurn() {
  firstTurn ??= collect('Chat', {
    conversationId: CONVERSATION_ID,
    message: { parts: [{ text: { text: QUESTION } }] },
  });
  return firstTurn;
}

// ---------------------------------------------------------------- lifecycle

before(async () => {
  const definition = await protoLoader.load('turnwire/v1/chat_service.proto', LOADER_OPTIONS);
  turnwire = grpc.loadPackageDefinition(definition).turnwire.v1;

  const port = await freePort();
  tmpDir = await mkdtemp(path.join(os.tmpdir(), 'turnwire-node-'));
  // The test controls the configuration: drop TURNWIRE_* settings of the caller.
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([name]) => !name.startsWith('TURNWIRE_')),
  );
  env.TURNWIRE_LIMITS__DRAIN_SECONDS = '0'; // no load balancer to drain from: stop at once
  server = spawn(
    TURNWIRE_BIN,
    ['serve', '--listen', `127.0.0.1:${port}`, '--store', `sqlite:///${path.join(tmpDir, 'turnwire.db')}`],
    { cwd: tmpDir, env, stdio: ['ignore', 'ignore', 'pipe'] },
  );
  server.stderr.setEncoding('utf8');
  server.stderr.on('data', (chunk) => {
    serverStderr = (serverStderr + chunk).slice(-64_000);
  });
  serverExit = new Promise((resolve) => {
    server.on('error', (error) => resolve({ code: null, signal: null, error }));
    server.on('exit', (code, signal) => resolve({ code, signal }));
  });

  // Reconnect every 0.1-0.5 s while the sidecar starts: grpc-js's default backoff grows to 120 s,
  // and a call made while it waits fails at once, so a slow start was found late (CI, 2026-12-07).
  client = new turnwire.ChatService(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), {
    'grpc.initial_reconnect_backoff_ms': 100,
    'grpc.max_reconnect_backoff_ms': 500,
  });

  // Ready when ListConversations answers (grpc.health.v1 is not vendored).
  const giveUp = Date.now() + STARTUP_TIMEOUT_MS;
  let exited = null;
  serverExit.then((result) => (exited = result));
  for (;;) {
    if (exited) {
      const why = exited.error ? exited.error.message : `code ${exited.code}, signal ${exited.signal}`;
      throw new Error(`turnwire exited before it was ready (${why}): ${TURNWIRE_BIN}${stderrTail()}`);
    }
    try {
      await unary('ListConversations', { pageSize: 1 }, 500);
      // Answered by this process (its own announcement), not by another test's sidecar that
      // took the same port first (this one then exits: cannot listen).
      if (serverStderr.includes(`turnwire listening on 127.0.0.1:${port}`)) break;
      throw new Error(`another process answers on port ${port}`);
    } catch (error) {
      if (Date.now() > giveUp) {
        throw new Error(
          `turnwire not ready after ${STARTUP_TIMEOUT_MS} ms (last error: ${error.message})${stderrTail()}`,
        );
      }
      await sleep(100);
    }
  }
});

after(async () => {
  client?.close();
  try {
    if (server) {
      if (server.exitCode === null && server.signalCode === null) server.kill('SIGTERM');
      let timer;
      const timeout = new Promise((resolve) => {
        timer = setTimeout(resolve, 15_000, 'timeout');
      });
      const result = await Promise.race([serverExit, timeout]);
      clearTimeout(timer);
      if (result === 'timeout') {
        server.kill('SIGKILL');
        assert.fail(`turnwire did not exit within 15 s of SIGTERM${stderrTail()}`);
      }
      assert.equal(result.code, 0, `turnwire exit after SIGTERM: ${JSON.stringify(result)}${stderrTail()}`);
    }
  } finally {
    if (tmpDir) await rm(tmpDir, { recursive: true, force: true });
  }
});

// ---------------------------------------------------------------- tests

test('Chat streams a complete two-step tool-calling turn', async () => {
  const responses = await runFirstTurn();
  const events = responses.map((response) => response.event);
  assert.ok(events.length > 0, 'the stream has events');

  // Envelope: 1..N without gaps, one conversation, one request id.
  assert.deepEqual(
    events.map((e) => e.sequenceNumber),
    events.map((_, i) => String(i + 1)),
    'sequence numbers are 1..N without gaps',
  );
  const requestId = events[0].requestId;
  assert.match(requestId, /^[A-Za-z0-9._:-]{1,128}$/, 'the server assigned a valid request id');
  for (const e of events) {
    assert.equal(e.conversationId, CONVERSATION_ID, `event ${e.sequenceNumber} conversation id`);
    assert.equal(e.requestId, requestId, `event ${e.sequenceNumber} request id`);
    assert.ok(e.event, `event ${e.sequenceNumber} has its oneof set`);
  }

  // Shape: collapse each text block (textStart, textDelta+, textEnd) into
  // "text" and each run of toolInputDelta into one, then compare exactly.
  const shape = [];
  const texts = []; // full text of each block, in order
  const inputDeltas = [];
  for (let i = 0; i < events.length; i++) {
    const e = events[i];
    if (e.event === 'textStart') {
      const id = e.textStart.id;
      let text = '';
      let j = i + 1;
      for (; j < events.length && events[j].event === 'textDelta'; j++) {
        assert.equal(events[j].textDelta.id, id, 'a text delta carries its block id');
        text += events[j].textDelta.delta;
      }
      assert.ok(j > i + 1, `text block ${id} has at least one delta`);
      assert.equal(events[j]?.event, 'textEnd', `text block ${id} is closed by textEnd`);
      assert.equal(events[j].textEnd.id, id, 'textEnd carries its block id');
      shape.push('text');
      texts.push(text);
      i = j;
    } else if (e.event === 'toolInputDelta') {
      inputDeltas.push(e.toolInputDelta);
      if (shape.at(-1) !== 'toolInputDelta') shape.push('toolInputDelta');
    } else {
      shape.push(e.event);
    }
  }
  assert.deepEqual(shape, [
    'turnStart',
    'stepStart',
    'text',
    'toolInputStart',
    'toolInputDelta',
    'toolInputAvailable',
    'toolOutputAvailable',
    'stepFinish',
    'stepStart',
    'text',
    'stepFinish',
    'turnEnd',
  ]);

  const only = (kind) => events.filter((e) => e.event === kind).map((e) => e[kind]);
  const [turnStart] = only('turnStart');
  const [toolInputStart] = only('toolInputStart');
  const [toolInputAvailable] = only('toolInputAvailable');
  const [toolOutputAvailable] = only('toolOutputAvailable');
  const stepStarts = only('stepStart');
  const stepFinishes = only('stepFinish');
  const turnEnd = events.at(-1).turnEnd;

  assert.equal(turnStart.model, 'scripted:demo');
  assert.equal(turnStart.continuation, false);
  assert.deepEqual(stepStarts.map((s) => s.stepNumber), [0, 1]);
  assert.deepEqual(stepFinishes.map((s) => s.stepNumber), [0, 1]);
  assert.deepEqual(
    stepFinishes.map((s) => s.finishReason),
    ['FINISH_REASON_TOOL_CALLS', 'FINISH_REASON_STOP'],
  );

  // The tool call: one id throughout, input streamed as JSON text and then
  // delivered as a google.protobuf.Struct.
  const callId = toolInputStart.toolCallId;
  assert.ok(callId, 'the tool call has an id');
  assert.equal(toolInputStart.toolName, 'get_weather');
  for (const d of inputDeltas) assert.equal(d.toolCallId, callId);
  assert.deepEqual(JSON.parse(inputDeltas.map((d) => d.inputTextDelta).join('')), { city: 'Paris' });
  assert.equal(toolInputAvailable.toolCallId, callId);
  assert.equal(toolInputAvailable.toolName, 'get_weather');
  assert.equal(toolInputAvailable.input.fields.city.kind, 'stringValue');
  assert.equal(toolInputAvailable.input.fields.city.stringValue, 'Paris');
  assert.deepEqual(fromStruct(toolInputAvailable.input), { city: 'Paris' });
  assert.equal(toolOutputAvailable.toolCallId, callId);
  assert.equal(toolOutputAvailable.preliminary, false);
  const output = fromValue(toolOutputAvailable.output);
  assert.equal(typeof output, 'object', 'the tool output is a JSON object');
  assert.equal(output.city, 'Paris');

  // The answer of the second step mentions Paris.
  assert.equal(texts.length, 2);
  assert.match(texts[1], /Paris/);

  // TurnEnd: completed, with the stored assistant message.
  assert.equal(turnEnd.status, 'TURN_STATUS_COMPLETED');
  assert.equal(turnEnd.error, null, 'no error on a completed turn');
  assert.equal(turnEnd.stepCount, 2);
  const message = turnEnd.message;
  assert.ok(message, 'TurnEnd carries the assistant message');
  assert.equal(message.role, 'ROLE_ASSISTANT');
  assert.equal(message.id, turnStart.messageId, 'stored under the id TurnStart announced');
  assert.ok(message.createTime, 'the assistant message has a create_time');
  const toolParts = message.parts.filter((p) => p.kind === 'toolCall').map((p) => p.toolCall);
  assert.equal(toolParts.length, 1, 'one tool call part');
  const [toolPart] = toolParts;
  assert.equal(toolPart.toolCallId, callId);
  assert.equal(toolPart.toolName, 'get_weather');
  assert.equal(toolPart.state, 'TOOL_CALL_STATE_OUTPUT_AVAILABLE');
  assert.deepEqual(fromStruct(toolPart.input), { city: 'Paris' });
  assert.deepEqual(fromValue(toolPart.output), output);
  const messageTexts = message.parts.filter((p) => p.kind === 'text').map((p) => p.text.text);
  assert.deepEqual(messageTexts, texts, 'the message holds the streamed text blocks');
  assert.deepEqual(
    message.parts.map((p) => p.kind),
    ['stepStart', 'text', 'toolCall', 'stepStart', 'text'],
  );
});

test('GetConversation returns the user message and the stored assistant message', async () => {
  const events = (await runFirstTurn()).map((response) => response.event);
  const turnEnd = events.at(-1).turnEnd;
  assert.ok(turnEnd?.message, 'the turn stored an assistant message');

  const { conversation } = await unary('GetConversation', { conversationId: CONVERSATION_ID });
  assert.equal(conversation.conversationId, CONVERSATION_ID);
  assert.equal(conversation.messageCount, '2');
  assert.deepEqual(conversation.messages.map((m) => m.role), ['ROLE_USER', 'ROLE_ASSISTANT']);

  const [user, assistant] = conversation.messages;
  assert.ok(user.id, 'the user message got an id');
  assert.deepEqual(user.parts, [{ kind: 'text', text: { text: QUESTION, id: '' } }]); // proto-loader fills defaults
  // create_time is output only: the server stamps the stored user message.
  assert.ok(user.createTime, 'the stored user message has a create_time');
  const micros = (ts) => BigInt(ts.seconds) * 1_000_000n + BigInt(Math.floor(ts.nanos / 1000));
  assert.ok(
    micros(user.createTime) <= micros(turnEnd.message.createTime),
    'the user message was stored no later than the reply',
  );
  assert.deepEqual(assistant, turnEnd.message, 'the stored assistant message equals TurnEnd.message');

  const listed = await unary('ListConversations', { pageSize: 1000 });
  const entry = listed.conversations.find((c) => c.conversationId === CONVERSATION_ID);
  assert.ok(entry, 'ListConversations lists the conversation');
  assert.equal(entry.messageCount, '2');
  assert.deepEqual(entry.messages, [], 'ListConversations leaves messages out');
});

test('Chat with an empty conversation id fails with INVALID_ARGUMENT and rich details', async () => {
  const error = await collect('Chat', {
    conversationId: '',
    message: { parts: [{ text: { text: 'hello' } }] },
  }).then(
    (responses) => assert.fail(`expected an error, got ${responses.length} responses`),
    (e) => e,
  );
  assert.equal(error.code, grpc.status.INVALID_ARGUMENT, `status: ${error.code} ${error.details}`);
  assert.match(error.details, /conversation_id/);

  const status = await decodeStatusDetails(error.metadata);
  assert.equal(status.code, grpc.status.INVALID_ARGUMENT);
  assert.equal(status.message, error.details);

  const badRequest = status.details.find((d) => d.typeUrl === 'type.googleapis.com/google.rpc.BadRequest');
  assert.ok(badRequest, `a BadRequest detail among ${status.details.map((d) => d.typeUrl)}`);
  const violation = badRequest.value.fieldViolations.find((v) => v.field === 'conversation_id');
  assert.ok(violation, `a field violation for conversation_id: ${JSON.stringify(badRequest.value)}`);
  assert.match(violation.description, /empty/);

  const errorInfo = status.details.find((d) => d.typeUrl === 'type.googleapis.com/google.rpc.ErrorInfo');
  assert.ok(errorInfo, 'an ErrorInfo detail');
  assert.equal(errorInfo.value.domain, 'turnwire.dev');
  assert.equal(errorInfo.value.reason, 'INVALID_FIELD');

});
