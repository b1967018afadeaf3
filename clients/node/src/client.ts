// TurnwireClient: the calls of calls.ts over Connect's gRPC transport (HTTP/2,
// @connectrpc/connect-node) and the service descriptors protoc-gen-es generates
// from protos/; Node.js only. Every RPC of turnwire.v1.ChatService is a method;
// `rpc` is the generated client itself for anything the methods leave out.

import { Code, type Interceptor, createClient } from '@connectrpc/connect';
import { createGrpcTransport } from '@connectrpc/connect-node';

import { type CallOpts, type CallSettings, TurnwireCalls, bearer } from './calls.js';
import { TurnwireError } from './errors.js';
import { type ConnectionSecurity, explainTlsMismatch } from './tls_probe.js';
import { AnsweredSessionManager } from './unanswered_streams.js';
import { ChatService } from './gen/turnwire/v1/chat_service_pb.js';

/** PEM text, or its bytes (e.g. a `Buffer` from `readFileSync`). */
export type Pem = string | Uint8Array;

/** TLS settings, as Node's `tls.connect` takes them. */
export interface TlsOptions {
  /** CA certificates to trust instead of Node's default roots (a private CA). */
  ca?: Pem | Pem[];
  /** Client certificate chain, for mutual TLS (with `key`). */
  cert?: Pem;
  /** Client private key, for mutual TLS (with `cert`). */
  key?: Pem;
  /** The name to verify the server's certificate against when it differs from the address's host. */
  serverName?: string;
}

/** What a {@link TurnwireClient} connects to, and how. */
export interface TurnwireClientOptions extends CallSettings {
  /** The sidecar's gRPC address, `host:port` (or a `http://` / `https://` URL). */
  address: string;
  /** Connect over TLS: `true` trusts Node's default CAs; an object sets CAs and a client certificate. */
  tls?: boolean | TlsOptions;
  /** Sent as `authorization: Bearer <token>` on every call. */
  token?: string;
  /**
   * The largest request this client sends, in bytes; a larger one fails at once with
   * `RESOURCE_EXHAUSTED` instead of being sent. Default 16 MiB, the sidecar's default
   * `limits.max_receive_message_bytes`. A request under it but over a lower sidecar limit is
   * refused by the sidecar: `RESOURCE_EXHAUSTED` too, once the sidecar stops reading it; set this
   * to the sidecar's value to be told before sending.
   */
  maxSendMessageBytes?: number;
}

/**
 * A client of one Turnwire sidecar over gRPC (its `listen` port; for the HTTP listener, and in
 * browsers, `TurnwireWebClient` of `@turnwire/client/web`). It holds one HTTP/2 connection, opened
 * on the first call; {@link TurnwireClient.close} closes it. Calls throw
 * {@link TurnwireError}; calls that run a turn return a {@link TurnStream}.
 */
export class TurnwireClient extends TurnwireCalls {
  private readonly session: AnsweredSessionManager;
  private readonly security: ConnectionSecurity;

  constructor(options: TurnwireClientOptions) {
    const secure = Boolean(options.tls) || options.address.startsWith('https://');
    const baseUrl = options.address.includes('://')
      ? options.address
      : `${secure ? 'https' : 'http'}://${options.address}`;
    const tls = typeof options.tls === 'object' ? options.tls : {};
    const session = new AnsweredSessionManager(baseUrl, undefined, {
      ca: Array.isArray(tls.ca) ? tls.ca.map(nodePem) : tls.ca && nodePem(tls.ca),
      cert: tls.cert && nodePem(tls.cert),
      key: tls.key && nodePem(tls.key),
      servername: tls.serverName,
    });
    const interceptors: Interceptor[] = options.token ? [bearer(options.token)] : [];
    const transport = createGrpcTransport({
      baseUrl,
      sessionManager: session,
      interceptors,
      writeMaxBytes: options.maxSendMessageBytes ?? DEFAULT_MAX_SEND_MESSAGE_BYTES,
    });
    super(createClient(ChatService, transport), options);
    this.session = session;
    const url = new URL(baseUrl);
    this.security = {
      host: url.hostname.replace(/^\[|\]$/g, ''),
      port: Number(url.port || (secure ? 443 : 80)),
      secure,
      clientCertificate: Boolean(tls.cert),
      servername: tls.serverName,
    };
  }

  /** Closes the connection; calls still running fail with `UNAVAILABLE`/`CANCELLED`. */
  close(): void {
    this.session.abort();
  }

  /**
   * `error` of a call that got no answer, with what went wrong said plainly when the transport
   * only reports a closed stream: a TLS mismatch found by {@link explainTlsMismatch} becomes
   * `UNAVAILABLE` naming the option to change; a request over `maxSendMessageBytes` names it.
   */
  protected override async explain(error: TurnwireError, options: CallOpts): Promise<TurnwireError> {
    if (options.signal?.aborted || error.reason) return error;
    if (error.code === 'RESOURCE_EXHAUSTED' && error.rawMessage.includes('writeMaxBytes')) {
      return new TurnwireError({
        grpcCode: Code.ResourceExhausted,
        message:
          `${error.rawMessage}: the request is larger than this client sends (maxSendMessageBytes); ` +
          'the sidecar takes requests up to its limits.max_receive_message_bytes (16 MiB by default)',
        cause: error,
      });
    }
    if (!['CANCELLED', 'UNAVAILABLE', 'INTERNAL', 'UNKNOWN'].includes(error.code)) return error;
    const explained = await explainTlsMismatch(this.security, nodeErrorCode(error));
    if (!explained) return error;
    return new TurnwireError({
      grpcCode: Code.Unavailable,
      message: `${explained} (${error.rawMessage})`,
      cause: error,
    });
  }
}

/** 16 MiB: the sidecar's default `limits.max_receive_message_bytes`. */
const DEFAULT_MAX_SEND_MESSAGE_BYTES = 16 * 1024 * 1024;

/** The Node.js error code (`ERR_SSL_…`) somewhere in `error`'s chain of causes, if any. */
function nodeErrorCode(error: unknown): string | undefined {
  for (let cause = error; cause instanceof Error; cause = cause.cause) {
    const code = (cause as NodeJS.ErrnoException).code;
    if (typeof code === 'string' && code.startsWith('ERR_')) return code;
  }
  return undefined;
}

function nodePem(pem: Pem): string | Buffer {
  return typeof pem === 'string' ? pem : Buffer.from(pem);
}
