// The Node.js example app (clients/node-example) with what only tests need, for
// tests/support/node_app.py to run as a child process:
//
//   node tests/support/node_app.mjs --listen HOST:PORT --sidecar HOST:PORT --journal FILE
//
// * Faults per turn, asked for in the request body: body.fault = {"<Rpc>": "hang" | "garbage" |
//   "error"} makes that hook never answer (the sidecar's deadline ends it), answer bytes that are
//   no protobuf message (BeforeTurn, BeforeStep, BeforeToolCall), or fail with INTERNAL. Each
//   fault is journaled as {rpc, fault} first.
// * A tool `nested_chat` that tries a blocking Chat on its own conversation from inside the turn
//   (forwarding the parent request id) and returns the status it got.
// * ListTools is journaled (a test waits for a restarted host to be listed again).
//
// The same kit calls as app.mjs, on a grpc.Server of its own: its TurnHooksService definition
// lets a "garbage" answer through as raw bytes.
//
// Prints "listening on HOST:PORT" once it serves.

import { parseArgs } from 'node:util';

import * as grpc from '@grpc/grpc-js';
import { TurnwireClient } from '@turnwire/client';
import { block, defineTool, hooks, toolHost } from '@turnwire/client/kit';

import { createHooks } from '../../clients/node-example/lib/hooks.mjs';
import { Journal } from '../../clients/node-example/lib/journal.mjs';
import { journaled, TOOLS } from '../../clients/node-example/lib/tools.mjs';

/** Field 1, length-delimited, with a length far past the end: no message parses from it. */
const GARBAGE_BYTES = Buffer.from([0x0a, 0xff, 0xff, 0xff, 0x7f]);
/** A text a "garbage" answer carries; a response whose encoding holds it is sent as GARBAGE_BYTES. */
const GARBAGE_MARK = 'node-app-test: answer garbage';
const GARBAGE_ANSWERS = {
  BeforeTurn: { system: GARBAGE_MARK },
  BeforeStep: { system: GARBAGE_MARK },
  BeforeToolCall: block(GARBAGE_MARK),
};

const { values } = parseArgs({
  options: { listen: { type: 'string' }, sidecar: { type: 'string' }, journal: { type: 'string' } },
});
const journal = new Journal(values.journal);
const client = new TurnwireClient({ address: values.sidecar });

function faultOf(rpc, request) {
  const turn = request?.turn ?? request?.failure?.turn;
  const fault = turn?.body?.fault?.[rpc];
  if (fault) journal.record({ rpc, requestId: turn.requestId, conversationId: turn.conversationId, fault });
  return fault;
}

/** `handlers`, each failing as its turn's body asks. */
function withFaults(handlers) {
  const wrapped = { ...handlers };
  for (const [name, handler] of Object.entries(handlers)) {
    if (name === 'onChunks') continue;
    const rpc = name[0].toUpperCase() + name.slice(1);
    wrapped[name] = async (request, context) => {
      const fault = faultOf(rpc, request);
      if (fault === 'hang') { // never answers: the sidecar gives the call up at its deadline
        await new Promise((resolve) => context.signal.addEventListener('abort', resolve, { once: true }));
        return undefined;
      }
      if (fault === 'garbage') return GARBAGE_ANSWERS[rpc];
      if (fault === 'error') throw Object.assign(new Error('fault asked by the test'), { code: grpc.status.INTERNAL });
      return handler(request, context);
    };
  }
  return wrapped;
}

/** The service definition with every response that carries GARBAGE_MARK sent as GARBAGE_BYTES. */
function garbageCapable(definition) {
  const mark = Buffer.from(GARBAGE_MARK);
  return Object.fromEntries(
    Object.entries(definition).map(([name, method]) => [
      name,
      {
        ...method,
        responseSerialize: (value) => {
          const bytes = method.responseSerialize(value);
          return bytes.includes(mark) ? GARBAGE_BYTES : bytes;
        },
      },
    ]),
  );
}

const nestedChat = defineTool({
  name: 'nested_chat',
  description: 'Tries a blocking Chat on its own conversation.',
  inputSchema: { type: 'object' },
  async execute(_input, { conversationId, parentRequestId }) {
    try {
      await client.chat(conversationId, 'nested', { parentRequestId }).collect();
      return { parent: parentRequestId, code: 'OK' };
    } catch (error) {
      return { parent: parentRequestId, code: error.code, details: error.rawMessage };
    }
  },
});

const hookServer = hooks(withFaults(createHooks({ journal, client })));
const host = toolHost(journaled(journal, [...TOOLS, nestedChat]));
const server = new grpc.Server();
server.addService(garbageCapable(hookServer.definition), hookServer.implementation);
server.addService(host.definition, {
  ...host.implementation,
  ListTools(call, callback) {
    journal.record({ rpc: 'ListTools' });
    host.implementation.ListTools(call, callback);
  },
});
const port = await new Promise((resolve, reject) =>
  server.bindAsync(values.listen, grpc.ServerCredentials.createInsecure(), (error, bound) => (error ? reject(error) : resolve(bound))),
);
console.log(`listening on ${values.listen.slice(0, values.listen.lastIndexOf(':'))}:${port}`);
