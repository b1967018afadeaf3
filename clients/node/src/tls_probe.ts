// Why a connection failed when the transport only says "http/2 stream closed": a TLS handshake
// of its own to the sidecar tells a plaintext client that the sidecar wants TLS, and a TLS client
// without a certificate that the sidecar wants one (mutual TLS). Asked only after a call failed
// before any answer, so a working connection never pays for it.

import tls from 'node:tls';

/** How the client connected: TLS or not, and whether it presents a client certificate. */
export interface ConnectionSecurity {
  host: string;
  port: number;
  secure: boolean;
  clientCertificate: boolean;
  servername?: string;
}

/** The HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113 §3.4): a gRPC server answers with its SETTINGS. */
const H2_PREFACE = Buffer.concat([
  Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'),
  Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]),
]);

/** The TLS alerts a server sends a client without the certificate it requires (TLS 1.3; TLS 1.2's handshake failure). */
const CERTIFICATE_ALERT = /CERTIFICATE_REQUIRED|ALERT_HANDSHAKE_FAILURE|ALERT_BAD_CERTIFICATE/;

/**
 * What the failure of a call to a sidecar connected as `security` says about a TLS mismatch:
 * a sentence saying what the sidecar wants and which option gives it, or undefined when the
 * probe finds no mismatch (or cannot tell within `timeoutMs`). `cause` is the failed call's
 * Node.js error code, when it had one (`ERR_SSL_WRONG_VERSION_NUMBER`: a TLS client, a
 * plaintext sidecar).
 */
export async function explainTlsMismatch(
  security: ConnectionSecurity,
  cause: string | undefined,
  timeoutMs = 3000,
): Promise<string | undefined> {
  const where = `the sidecar at ${security.host}:${security.port}`;
  if (security.secure && cause === 'ERR_SSL_WRONG_VERSION_NUMBER') {
    return `${where} does not speak TLS (it serves plaintext): connect without \`tls\` (and with an http:// address)`;
  }
  if (security.secure && security.clientCertificate) return undefined;
  const outcome = await probe(security, timeoutMs);
  if (!security.secure && (outcome === 'accepted' || outcome === 'certificate-required')) {
    return `${where} wants TLS, and this client connected in plaintext: pass \`tls: true\` or \`tls: { ca }\` (or an https:// address)`;
  }
  if (security.secure && outcome === 'certificate-required') {
    return `${where} wants a client certificate (mutual TLS), and this client presented none: pass \`tls: { cert, key }\``;
  }
  return undefined;
}

/** `no-tls`: no TLS handshake; `accepted`: the HTTP/2 server answered; `unknown`: neither within the time. */
type ProbeOutcome = 'no-tls' | 'certificate-required' | 'accepted' | 'unknown';

/** One TLS handshake (certificates not checked: this only asks what the server speaks), then the HTTP/2 preface. */
function probe(security: ConnectionSecurity, timeoutMs: number): Promise<ProbeOutcome> {
  return new Promise((resolve) => {
    let handshaken = false;
    const socket = tls.connect({
      host: security.host,
      port: security.port,
      servername: security.servername ?? (isIp(security.host) ? undefined : security.host),
      ALPNProtocols: ['h2'],
      rejectUnauthorized: false,
    });
    const done = (outcome: ProbeOutcome) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(outcome);
    };
    const timer = setTimeout(() => done('unknown'), timeoutMs);
    socket.once('secureConnect', () => {
      handshaken = true;
      socket.write(H2_PREFACE);
    });
    socket.once('data', () => done('accepted'));
    socket.once('error', (error: NodeJS.ErrnoException) => {
      if (CERTIFICATE_ALERT.test(`${error.code ?? ''} ${error.message}`)) done('certificate-required');
      else done(handshaken ? 'unknown' : 'no-tls');
    });
    socket.once('close', () => done(handshaken ? 'certificate-required' : 'no-tls'));
  });
}

function isIp(host: string): boolean {
  return /^[\d.]+$/.test(host) || host.includes(':');
}
