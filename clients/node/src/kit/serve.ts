// One gRPC server for a hook server and a tool host: the sidecar reaches both at the same
// address (`middleware: - remote: {address}` and `tools: {hosts: [{address}]}` in its config).

import * as grpc from '@grpc/grpc-js';

import type { HookServer } from './hooks.js';
import { type Tool, toolHost } from './tools.js';

/** Options of `serve()`. */
export interface ServeOptions {
  /** From `hooks({...})`; omit to serve no TurnHooksService. */
  hooks?: HookServer;
  /** Tools from `defineTool(...)`; omit to serve no ToolExecutorService. */
  tools?: readonly Tool[];
  /** HOST:PORT to listen on (port 0 picks a free one); default `127.0.0.1:7001`. */
  listen?: string;
  /** Default: plaintext (`grpc.ServerCredentials.createInsecure()`); TLS with `createSsl`. */
  credentials?: grpc.ServerCredentials;
  /** grpc-js channel options of the server (message size limits, keepalive…). */
  options?: grpc.ServerOptions;
}

/** A running server. */
export interface Served {
  server: grpc.Server;
  /** HOST:PORT it listens on (the port chosen when 0 was asked). */
  address: string;
  port: number;
  /** Stops taking calls and waits for those running; after `graceMs` (default 5000) ends them. */
  close(graceMs?: number): Promise<void>;
}

/**
 * Serves `hooks` and `tools` on one gRPC server at `listen`. Resolves once it listens; rejects
 * when the address cannot be bound (in use, no such interface), and with a `TypeError` when there
 * is nothing to serve (no hooks, no tools), as the Python and Go kits refuse it.
 */
export async function serve({
  hooks,
  tools,
  listen = '127.0.0.1:7001',
  credentials,
  options,
}: ServeOptions): Promise<Served> {
  if (!hooks && !tools?.length) {
    throw new TypeError('serve(): nothing to serve: give hooks, tools or both');
  }
  const server = new grpc.Server(options);
  if (hooks) server.addService(hooks.definition, hooks.implementation);
  if (tools) {
    const host = toolHost(tools);
    server.addService(host.definition, host.implementation);
  }
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync(listen, credentials ?? grpc.ServerCredentials.createInsecure(), (error, bound) =>
      error ? reject(error) : resolve(bound),
    ),
  );
  return {
    server,
    port,
    address: `${listen.slice(0, listen.lastIndexOf(':'))}:${port}`,
    close: (graceMs) => close(server, graceMs),
  };
}

function close(server: grpc.Server, graceMs = 5000): Promise<void> {
  return new Promise((resolve) => {
    const force = setTimeout(() => server.forceShutdown(), graceMs);
    server.tryShutdown(() => {
      clearTimeout(force);
      resolve();
    });
  });
}
