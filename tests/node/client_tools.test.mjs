// Client-side tools from Node.js (docs/semantics.md §6): the sidecar streams a call of a tool the
// client offered and ends the turn with it pending; this client "runs" the tool and sends the
// result with SubmitToolResults(auto_continue), and the continuation streams on that call. A
// parallel batch of two waits for both results: the first alone ends SKIPPED
// (TOOL_RESULTS_INCOMPLETE), the second streams the continuation.
//
// Spawns `turnwire serve` with a config whose scripted model calls the client tools.
// Run: node --test tests/node/     (TURNWIRE_BIN overrides the server command)

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const require = createRequire(import.meta.url);
const protobuf = createRequire(require.resolve('@grpc/proto-loader'))('protobufjs');

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const PROTOS = path.join(REPO, 'protos');
const TURNWIRE_BIN = process.env.TURNWIRE_BIN || path.join(REPO, '.venv', 'bin', 'turnwire');
// A deadline, not a speed target: a loaded 2-core CI has taken over 30 s to start a sidecar.
const STARTUP_TIMEOUT_MS = 60_000;
const CALL_TIMEOUT_MS = 10_000;

const LOADER_OPTIONS = { includeDirs: [PROTOS], keepCase: false, longs: String, enums: String, defaults: true, oneofs: true };

// JSON is YAML: the scripted model calls the client tools; `answer` continues in text.
const CONFIG = {
  default_model: 'scripted:locate',
  providers: {
    scripted: {
      scripts: {
        locate: [
          { text: 'Asking your device.', tool_calls: [{ name: 'get_location', input: { precision: 'city' } }] },
          { text: 'unreachable' },
        ],
        pair: [
          { tool_calls: [{ name: 'get_location', input: {} }, { name: 'read_clipboard', input: {} }] },
          { text: 'unreachable' },
        ],
        answer: [{ text: 'You are in Paris.' }],
      },
    },
  },
};

const CLIENT_TOOLS = [
  {
    name: 'get_location',
    description: "The user's location, from the device",
    inputSchema: { fields: { type: { stringValue: 'object' } } },
  },
  { name: 'read_clipboard', description: 'The clipboard text' },
];

// What this client does when the model calls one of its tools.
const RUN_TOOL = {
  get_location: () => ({ city: 'Paris', lat: 48.8566 }),
  read_clipboard: () => 'copied text',
};

let server;
let serverExit;
let serverStderr = '';
let tmpDir;
let client;

function stderrTail() {
  const tail = serverStderr.slice(-4000);
  return tail ? `\n--- turnwire stderr (tail) ---\n${tail}` : '';
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

/** Runs a server-streaming call to its end; resolves with its events. */
function events(method, request, timeoutMs = CALL_TIMEOUT_MS) {
  return new Promise((resolve, reject) => {
    const found = [];
    const call = client[method](request, { deadline: deadline(timeoutMs) });
    call.on('data', (response) => found.push(response.event));
    call.on('error', reject);
    call.on('end', () => resolve(found));
  });
}

// google.rpc.ErrorInfo is not vendored: declared here with the upstream field numbers.
const ErrorInfo = protobuf
  .parse('syntax = "proto3"; package google.rpc; message ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }')
  .root.lookupType('google.rpc.ErrorInfo');

function errorInfo(status) {
  // The bundled google.protobuf.Any keeps its proto field name type_url.
  const detail = (status?.details ?? []).find(
    (d) => (d.type_url ?? d.typeUrl) === 'type.googleapis.com/google.rpc.ErrorInfo',
  );
  assert.ok(detail, `an ErrorInfo in ${JSON.stringify(status)}`);
  return ErrorInfo.toObject(ErrorInfo.decode(detail.value));
}

const only = (found, kind) => found.filter((e) => e.event === kind).map((e) => e[kind]);
const turnEnd = (found) => found.at(-1).turnEnd;
const toolCalls = (message) => message.parts.filter((p) => p.kind === 'toolCall').map((p) => p.toolCall);

/** A Chat turn offering the client tools; it ends with the model's client calls pending. */
async function pendingTurn(model) {
  const conversationId = `node-tools-${process.pid}-${model}-${Date.now()}`;
  const found = await events('Chat', {
    conversationId,
    model: `scripted:${model}`,
    message: { parts: [{ text: { text: 'Where am I?' } }] },
    clientTools: CLIENT_TOOLS,
  });
  const end = turnEnd(found);
  assert.equal(end.status, 'TURN_STATUS_COMPLETED', JSON.stringify(end.error));
  const available = only(found, 'toolInputAvailable');
  assert.ok(available.length > 0, 'the client calls were streamed');
  assert.equal(only(found, 'toolOutputAvailable').length, 0, 'the server does not run client tools');
  for (const call of toolCalls(end.message)) {
    assert.equal(call.clientExecuted, true);
    assert.equal(call.state, 'TOOL_CALL_STATE_INPUT_AVAILABLE');
  }
  return { conversationId, calls: available, message: end.message };
}

/** Run a streamed call the way a client would and send its result. */
function submitResult(conversationId, call) {
  const output = RUN_TOOL[call.toolName](JSON.parse(call.inputJson));
  return events('SubmitToolResults', {
    conversationId,
    results: [{ toolCallId: call.toolCallId, outputJson: JSON.stringify(output) }],
    autoContinue: true,
    model: 'scripted:answer',
    clientTools: CLIENT_TOOLS,
  });
}

before(async () => {
  const definition = await protoLoader.load('turnwire/v1/chat_service.proto', LOADER_OPTIONS);
  const turnwire = grpc.loadPackageDefinition(definition).turnwire.v1;
  const port = await freePort();
  tmpDir = await mkdtemp(path.join(os.tmpdir(), 'turnwire-node-tools-'));
  const configPath = path.join(tmpDir, 'turnwire.yaml');
  await writeFile(configPath, JSON.stringify(CONFIG));
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('TURNWIRE_')));
  env.TURNWIRE_LIMITS__DRAIN_SECONDS = '0'; // no load balancer to drain from: stop at once
  server = spawn(
    TURNWIRE_BIN,
    [
      'serve',
      '--listen', `127.0.0.1:${port}`,
      '--store', `sqlite:///${path.join(tmpDir, 'turnwire.db')}`,
      '--config', configPath,
    ],
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
  client = new turnwire.ChatService(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  const giveUp = Date.now() + STARTUP_TIMEOUT_MS;
  let exited = null;
  serverExit.then((result) => (exited = result));
  for (;;) {
    if (exited) throw new Error(`turnwire exited before it was ready: ${JSON.stringify(exited)}${stderrTail()}`);
    try {
      await unary('ListConversations', { pageSize: 1 }, 500);
      // Answered by this process (its own announcement), not by another test's sidecar that
      // took the same port first (this one then exits: cannot listen).
      if (serverStderr.includes(`turnwire listening on 127.0.0.1:${port}`)) break;
      throw new Error(`another process answers on port ${port}`);
    } catch (error) {
      if (Date.now() > giveUp) throw new Error(`turnwire not ready: ${error.message}${stderrTail()}`);
      await sleep(100); // polling the readiness condition, not a guessed wait
    }
  }
});

after(async () => {
  client?.close();
  try {
    if (server && server.exitCode === null && server.signalCode === null) {
      server.kill('SIGTERM');
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

test('a client tool call ends the turn pending; its result continues the turn', async () => {
  const { conversationId, calls, message } = await pendingTurn('locate');
  assert.equal(calls.length, 1);
  const [call] = calls;
  assert.equal(call.toolName, 'get_location');
  assert.deepEqual(JSON.parse(call.inputJson), { precision: 'city' });

  const found = await submitResult(conversationId, call);
  const [start] = only(found, 'turnStart');
  assert.ok(start, 'the continuation streams on SubmitToolResults');
  assert.equal(start.continuation, true);
  assert.notEqual(start.messageId, message.id, 'the continuation stores a new assistant message');
  assert.equal(only(found, 'textDelta').map((d) => d.delta).join(''), 'You are in Paris.');
  assert.equal(turnEnd(found).status, 'TURN_STATUS_COMPLETED');
  assert.deepEqual(
    found.map((e) => e.sequenceNumber),
    found.map((_, i) => String(i + 1)),
    'sequence numbers are 1..N without gaps',
  );

  const { conversation } = await unary('GetConversation', { conversationId });
  assert.deepEqual(conversation.messages.map((m) => m.role), ['ROLE_USER', 'ROLE_ASSISTANT', 'ROLE_ASSISTANT']);
  const [stored] = toolCalls(conversation.messages[1]);
  assert.equal(stored.state, 'TOOL_CALL_STATE_OUTPUT_AVAILABLE');
  assert.deepEqual(JSON.parse(stored.outputJson), { city: 'Paris', lat: 48.8566 });
});

test('a parallel batch waits for both results: the first ends SKIPPED, the second continues', async () => {
  const { conversationId, calls } = await pendingTurn('pair');
  assert.deepEqual(calls.map((c) => c.toolName), ['get_location', 'read_clipboard']);

  const first = await submitResult(conversationId, calls[0]);
  assert.deepEqual(first.map((e) => e.event), ['turnEnd'], 'no turn runs while a call of the batch waits');
  const skipped = turnEnd(first);
  assert.equal(skipped.status, 'TURN_STATUS_SKIPPED');
  const info = errorInfo(skipped.error);
  assert.equal(info.reason, 'TOOL_RESULTS_INCOMPLETE');
  assert.equal(info.metadata.waiting_tool_call_ids, calls[1].toolCallId);
  const states = toolCalls(skipped.message).map((c) => c.state);
  assert.deepEqual(states, ['TOOL_CALL_STATE_OUTPUT_AVAILABLE', 'TOOL_CALL_STATE_INPUT_AVAILABLE']);

  const second = await submitResult(conversationId, calls[1]);
  const [start] = only(second, 'turnStart');
  assert.ok(start?.continuation, 'the last result runs the continuation');
  assert.equal(turnEnd(second).status, 'TURN_STATUS_COMPLETED');

  const { conversation } = await unary('GetConversation', { conversationId });
  assert.equal(conversation.messages.length, 3, 'exactly one continuation');
  assert.deepEqual(
    toolCalls(conversation.messages[1]).map((c) => [c.state, JSON.parse(c.outputJson)]),
    [
      ['TOOL_CALL_STATE_OUTPUT_AVAILABLE', { city: 'Paris', lat: 48.8566 }],
      ['TOOL_CALL_STATE_OUTPUT_AVAILABLE', 'copied text'],
    ],
  );
});
