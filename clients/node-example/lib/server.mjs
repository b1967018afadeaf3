// One gRPC server for both services: the sidecar reaches the hooks and the tools at the same
// address (`middleware: - remote: {address}` and `tools: {hosts: [{address}]}` in its config).

import grpc from '@grpc/grpc-js';

import { turnwire } from './proto.mjs';

/**
 * Serve `hooks` (TurnHooksService handlers) and `tools` (ToolExecutorService handlers) on
 * `listen` (HOST:PORT; port 0 picks a free one). Resolves with {server, address}. The hooks are
 * offered on the HookSession stream too (withHookSession) unless `hookSession` is false.
 */
export function serve({ listen, hooks, tools, hooksService = turnwire.TurnHooksService.service, hookSession = true }) {
  const server = new grpc.Server();
  if (hooks) server.addService(hooksService, hookSession ? withHookSession(hooks) : hooks);
  if (tools) server.addService(turnwire.ToolExecutorService.service, tools);
  return new Promise((resolve, reject) => {
    server.bindAsync(listen, grpc.ServerCredentials.createInsecure(), (error, port) => {
      if (error) return reject(error);
      resolve({ server, address: `${listen.slice(0, listen.lastIndexOf(':'))}:${port}` });
    });
  });
}

/** HookSessionRequest's `hook` member → the unary handler that answers it. */
const SESSION_HOOKS = {
  beforeTurn: 'BeforeTurn',
  beforeStep: 'BeforeStep',
  beforeToolCall: 'BeforeToolCall',
  afterToolCall: 'AfterToolCall',
  onStepFinish: 'OnStepFinish',
  onChatResponse: 'OnChatResponse',
  classifyChatError: 'ClassifyChatError',
  onChatError: 'OnChatError',
};

/**
 * The unary `hooks` handlers plus HookSession, the stream on which the sidecar sends a turn's
 * hook calls (protos/turnwire/v1/hooks.proto): each request holds one or more calls; each call
 * goes to its unary handler, one at a time and in order, with the stream's metadata (the turn's
 * parent request id), and is answered (its answer or error, by call id) as soon as it is done. GetHookSubscriptions says `hookSession: true` so the sidecar uses it; an
 * older sidecar keeps calling the unary handlers.
 */
export function withHookSession(hooks) {
  return {
    ...hooks,
    GetHookSubscriptions(call, callback) {
      hooks.GetHookSubscriptions(call, (error, response) =>
        callback(error, error ? response : { ...response, hookSession: true }),
      );
    },
    HookSession(stream) {
      let queue = Promise.resolve();
      stream.on('data', (request) => {
        queue = queue.then(() => respond(stream, request));
      });
      stream.on('end', () => queue.then(() => stream.end()));
      stream.on('error', () => {}); // the sidecar cancelled the stream (a deadline, its turn ended)
    },
  };

  // Each call is answered as soon as it is done (a stuck call must not hold the answers of the
  // calls before it in the same request).
  async function respond(stream, request) {
    for (const call of request.calls) {
      const answer = await answerOf(stream, call);
      if (stream.cancelled) return;
      stream.write(typeof answer === 'symbol' ? answer : { answers: [answer] }); // symbol: a test's raw bytes
    }
  }

  function answerOf(stream, call) {
    const member = call.hook;
    const handler = hooks[SESSION_HOOKS[member]];
    const failed = (code, message) => ({ id: call.id, error: { code, message } });
    if (!handler) return failed(grpc.status.UNIMPLEMENTED, `${SESSION_HOOKS[member] ?? member} is not implemented`);
    const unary = { request: call[member], metadata: stream.metadata, getPeer: () => stream.getPeer() };
    return new Promise((resolve) => {
      try {
        handler(unary, (error, response) => {
          if (error) return resolve(failed(error.code ?? grpc.status.UNKNOWN, error.details ?? error.message ?? ''));
          resolve(typeof response === 'symbol' ? response : { id: call.id, [member]: response ?? {} });
        });
      } catch (error) {
        resolve(failed(grpc.status.UNKNOWN, String(error?.message ?? error)));
      }
    });
  }
}
