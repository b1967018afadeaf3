// One gRPC server for a hook server and a tool host: the sidecar reaches both at the same
// address (`middleware: - remote: {address}` and `tools: {hosts: [{address}]}` in its config).

import { lstat, unlink } from 'node:fs/promises';
import { connect } from 'node:net';

import * as grpc from '@grpc/grpc-js';

import type { HookServer } from './hooks.js';
import { type Tool, toolHost } from './tools.js';

/** Options of `serve()`. */
export interface ServeOptions {
  /** From `hooks({...})`; omit to serve no TurnHooksService. */
  hooks?: HookServer;
  /** Tools from `defineTool(...)`; omit to serve no ToolExecutorService. */
  tools?: readonly Tool[];
  /**
   * HOST:PORT to listen on (port 0 picks a free one), or `unix:PATH` (a socket a killed server
   * left there is replaced); default `127.0.0.1:7001`.
   */
  listen?: string;
  /** Default: plaintext (`grpc.ServerCredentials.createInsecure()`); TLS with `createSsl`. */
  credentials?: grpc.ServerCredentials;
  /** grpc-js channel options of the server (message size limits, keepalive…). */
  options?: grpc.ServerOptions;
}

/** A running server. */
export interface Served {
  server: grpc.Server;
  /** HOST:PORT it listens on (the port chosen when 0 was asked), or `listen` as given for `unix:`. */
  address: string;
  /** The TCP port; 0 on a unix socket. */
  port: number;
  /** Stops taking calls and waits for those running; after `graceMs` (default 5000) ends them. */
  close(graceMs?: number): Promise<void>;
}

/**
 * Serves `hooks` and `tools` on one gRPC server at `listen`. Resolves once it listens; rejects
 * when the address cannot be bound (in use, no such interface, a unix socket a live server
 * listens on), and with a `TypeError` when there is nothing to serve (no hooks, no tools), as the
 * Python and Go kits refuse it. A unix socket file no process accepts on (a killed server's) is
 * removed first, so a restart after a crash serves again, as the Python and Go kits do.
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
  const socket = unixPath(listen);
  if (socket !== undefined) await removeStaleSocket(socket);
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync(listen, credentials ?? grpc.ServerCredentials.createInsecure(), (error, bound) =>
      error ? reject(error) : resolve(bound),
    ),
  );
  return {
    server,
    // grpc-js answers 1 for a unix socket: there is no port.
    port: socket === undefined ? port : 0,
    address: socket === undefined ? `${listen.slice(0, listen.lastIndexOf(':'))}:${port}` : listen,
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

/** The socket's path of a `unix:PATH` or `unix:///PATH` address (gRPC's names); else undefined. */
function unixPath(listen: string): string | undefined {
  if (!listen.startsWith('unix:')) return undefined;
  return listen.startsWith('unix://') ? listen.slice('unix://'.length) : listen.slice('unix:'.length);
}

/**
 * Removes the socket file at `path` when connecting to it is refused (no process accepts on it:
 * a crashed server's leftover, on which binding fails with EADDRINUSE). Anything else there (a
 * live server's socket, a regular file, nothing) is left for the bind to report.
 */
async function removeStaleSocket(path: string): Promise<void> {
  const stat = await lstat(path).catch(() => undefined);
  if (!stat?.isSocket()) return;
  const refused = await new Promise<boolean>((resolve) => {
    const probe = connect(path);
    probe.once('connect', () => {
      probe.destroy();
      resolve(false);
    });
    probe.once('error', (error: NodeJS.ErrnoException) => resolve(error.code === 'ECONNREFUSED'));
  });
  if (refused) await unlink(path).catch(() => undefined);
}
