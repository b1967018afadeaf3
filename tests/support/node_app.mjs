// The Node.js example app (clients/node-example) with what only tests need, for
// tests/support/node_app.py to run as a child process:
//
//   node tests/support/node_app.mjs --listen HOST:PORT --sidecar HOST:PORT --journal FILE
//
// * Faults per turn, asked for in the request body: body.fault = {"<Rpc>": "hang" | "garbage" |
//   "error"} makes that hook never answer (the sidecar's deadline ends it), answer bytes that are
//   no protobuf message, or fail with INTERNAL. Each fault is journaled as {rpc, fault} first.
// * A tool `nested_chat` that tries a blocking Chat on its own conversation from inside the turn
//   (forwarding the parent request id) and returns the status it got.
//
// Prints "listening on HOST:PORT" once it serves.

import { parseArgs } from 'node:util';

import grpc from '@grpc/grpc-js';

import { createHooks } from '../../clients/node-example/lib/hooks.mjs';
import { Journal } from '../../clients/node-example/lib/journal.mjs';
import {
  parentMetadata,
  parentRequestIdOf,
  sidecarClient,
  turnwire,
  userMessage,
} from '../../clients/node-example/lib/proto.mjs';
import { serve } from '../../clients/node-example/lib/server.mjs';
import { createTools } from '../../clients/node-example/lib/tools.mjs';

/** Field 1, length-delimited, with a length far past the end: no message parses from it. */
const GARBAGE_BYTES = Buffer.from([0x0a, 0xff, 0xff, 0xff, 0x7f]);
const GARBAGE = Symbol('garbage');

const { values } = parseArgs({
  options: { listen: { type: 'string' }, sidecar: { type: 'string' }, journal: { type: 'string' } },
});
const journal = new Journal(values.journal);
const client = sidecarClient(values.sidecar);

// The service definition with every response serializer letting GARBAGE through as raw bytes.
const hooksService = Object.fromEntries(
  Object.entries(turnwire.TurnHooksService.service).map(([name, method]) => [
    name,
    { ...method, responseSerialize: (value) => (value === GARBAGE ? GARBAGE_BYTES : method.responseSerialize(value)) },
  ]),
);

function faultOf(rpc, request) {
  const turn = request?.turn ?? request?.failure?.turn;
  const fault = turn?.body?.fields?.fault?.structValue?.fields?.[rpc]?.stringValue;
  if (fault) journal.record({ rpc, requestId: turn.requestId, conversationId: turn.conversationId, fault });
  return fault;
}

function withFaults(hooks) {
  const wrapped = { ...hooks };
  for (const [rpc, handler] of Object.entries(hooks)) {
    if (rpc === 'GetHookSubscriptions' || rpc === 'OnChunks') continue;
    wrapped[rpc] = (call, callback) => {
      const fault = faultOf(rpc, call.request);
      if (fault === 'hang') return undefined; // never answers
      if (fault === 'garbage') return callback(null, GARBAGE);
      if (fault === 'error') return callback({ code: grpc.status.INTERNAL, details: 'fault asked by the test' });
      return handler(call, callback);
    };
  }
  return wrapped;
}

const nestedChat = {
  async *nested_chat(_input, _signal, call) {
    const parent = parentRequestIdOf(call);
    return await new Promise((resolve) => {
      const stream = client.Chat(
        { conversationId: call.request.conversationId, message: userMessage('nested') },
        parentMetadata(parent),
      );
      stream.on('data', () => {});
      stream.on('error', (error) => resolve({ parent, code: grpc.status[error.code], details: error.details }));
      stream.on('end', () => resolve({ parent, code: 'OK' }));
    });
  },
};

const { address } = await serve({
  listen: values.listen,
  hooks: withFaults(createHooks({ journal, sidecar: values.sidecar })),
  hooksService,
  tools: createTools({
    journal,
    extra: nestedChat,
    extraSpecs: [{ name: 'nested_chat', description: 'Tries a blocking Chat on its own conversation.', inputSchema: { type: 'object' } }],
  }),
});
console.log(`listening on ${address}`);
