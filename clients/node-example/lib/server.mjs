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
 * hook calls (protos/turnwire/v1/hooks.proto): each request goes to its unary handler, one at a
 * time and in order, with the stream's metadata (the turn's parent request id), and its answer
 * or error is written back with the request's id. GetHookSubscriptions says `hookSession: true`
 * so the sidecar uses it; an older sidecar keeps calling the unary handlers.
 */
export function withHookSession(hooks) {
  return {
    ...hooks,
    GetHookSubscriptions(call, callback) {
      hooks.GetHookSubscriptions(call, (error, response) =>
        callback(error, error ? response : { ...response, hookSession: true }),
      );
    },
    HookSession(call) {
      let queue = Promise.resolve();
      call.on('data', (request) => {
        queue = queue.then(() => answer(call, request));
      });
      call.on('end', () => queue.then(() => call.end()));
      call.on('error', () => {}); // the sidecar cancelled the stream (a deadline, its turn ended)
    },
  };

  function answer(call, request) {
    const member = request.hook;
    const handler = hooks[SESSION_HOOKS[member]];
    return new Promise((resolve) => {
      const reply = (message) => {
        if (!call.cancelled) call.write(message);
        resolve();
      };
      const fail = (code, message) => reply({ id: request.id, error: { code, message } });
      if (!handler) return fail(grpc.status.UNIMPLEMENTED, `${SESSION_HOOKS[member] ?? member} is not implemented`);
      const unary = { request: request[member], metadata: call.metadata, getPeer: () => call.getPeer() };
      try {
        handler(unary, (error, response) => {
          if (error) return fail(error.code ?? grpc.status.UNKNOWN, error.details ?? error.message ?? '');
          // Anything but a message (a test's raw bytes) is written as it is.
          reply(typeof response === 'symbol' ? response : { id: request.id, [member]: response ?? {} });
        });
      } catch (error) {
        fail(grpc.status.UNKNOWN, String(error?.message ?? error));
      }
    });
  }
}
