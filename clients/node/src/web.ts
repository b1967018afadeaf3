// @turnwire/client/web: the browser entry. TurnwireWebClient makes the same calls as the Node.js
// client (calls.ts) through @connectrpc/connect-web's fetch transports to the sidecar's HTTP
// listener (`http.listen`; docs/api/http.md): Connect by default, or gRPC-Web. It imports no
// Node.js module, so bundlers (esbuild, Vite, webpack) take it as is.

import { createRegistry } from '@bufbuild/protobuf';
import { createClient } from '@connectrpc/connect';
import { createConnectTransport, createGrpcWebTransport } from '@connectrpc/connect-web';

import { type CallSettings, TurnwireCalls, bearer } from './calls.js';
import { file_google_rpc_error_details } from './gen/google/rpc/error_details_pb.js';
import { ChatService } from './gen/turnwire/v1/chat_service_pb.js';

export * from './api.js';

/** What a {@link TurnwireWebClient} calls, and how. */
export interface TurnwireWebClientOptions extends CallSettings {
  /** The sidecar's HTTP listener, e.g. `https://chat.example.com/turnwire` or `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** `connect` (the default; HTTP/1.1 or HTTP/2) or `grpc-web`; the listener serves both. */
  protocol?: 'connect' | 'grpc-web';
  /** Sent as `authorization: Bearer <token>` on every call (a header, never a cookie). */
  token?: string;
  /** Protobuf binary on the wire instead of JSON (the default, readable in a browser's devtools). */
  useBinaryFormat?: boolean;
  /** The `fetch` the transport calls; `globalThis.fetch` when unset. */
  fetch?: typeof globalThis.fetch;
}

/**
 * A client of one Turnwire sidecar from a browser (or any runtime with `fetch`). Each call is its
 * own `fetch`; leaving a turn stream, or aborting its signal, ends that request, and the sidecar
 * applies the turn's disconnect policy. Calls throw {@link TurnwireError} with the `google.rpc`
 * details decoded (ErrorInfo, BadRequest, RetryInfo); calls that run a turn return a {@link TurnStream}.
 */
export class TurnwireWebClient extends TurnwireCalls {
  constructor(options: TurnwireWebClientOptions) {
    const transportOptions = {
      baseUrl: options.baseUrl,
      interceptors: options.token ? [bearer(options.token)] : [],
      useBinaryFormat: options.useBinaryFormat ?? false,
      // JSON error bodies carry the google.rpc details in google.protobuf.Any: their types must be known.
      jsonOptions: { registry: createRegistry(file_google_rpc_error_details) },
      fetch: options.fetch,
    };
    super(
      createClient(
        ChatService,
        options.protocol === 'grpc-web'
          ? createGrpcWebTransport(transportOptions)
          : createConnectTransport(transportOptions),
      ),
      options,
    );
  }

  /** Nothing to release: no connection outlives its call (the browser pools them). */
  close(): void {}
}
