// One gRPC server for both services: the sidecar reaches the hooks and the tools at the same
// address (`middleware: - remote: {address}` and `tools: {hosts: [{address}]}` in its config).

import grpc from '@grpc/grpc-js';

import { turnwire } from './proto.mjs';

/**
 * Serve `hooks` (TurnHooksService handlers) and `tools` (ToolExecutorService handlers) on
 * `listen` (HOST:PORT; port 0 picks a free one). Resolves with {server, address}.
 */
export function serve({ listen, hooks, tools, hooksService = turnwire.TurnHooksService.service }) {
  const server = new grpc.Server();
  if (hooks) server.addService(hooksService, hooks);
  if (tools) server.addService(turnwire.ToolExecutorService.service, tools);
  return new Promise((resolve, reject) => {
    server.bindAsync(listen, grpc.ServerCredentials.createInsecure(), (error, port) => {
      if (error) return reject(error);
      resolve({ server, address: `${listen.slice(0, listen.lastIndexOf(':'))}:${port}` });
    });
  });
}
