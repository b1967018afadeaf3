// A TLS mismatch said plainly (issue 32 item 17), against real `turnwire serve` processes: a
// plaintext client of a TLS sidecar, a TLS client without a certificate of a mutual-TLS sidecar,
// and a TLS client of a plaintext sidecar each get UNAVAILABLE naming what the sidecar wants and
// the option that gives it (before: `CANCELLED: http/2 stream closed with error code CANCEL`, or
// an OpenSSL "wrong version number" as INTERNAL).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { TurnwireClient } from '@turnwire/client';

import { makeCertificates } from './certificates.mjs';
import { startSidecar, startSidecars } from './sidecar.mjs';

let certificates;
const sidecars = {};

before(async () => {
  certificates = makeCertificates();
  const tls = { cert_file: certificates.file('server.pem'), key_file: certificates.file('server.key') };
  const mutual = { ...tls, client_ca_file: certificates.file('ca.pem'), client_auth: 'require' };
  [sidecars.tls, sidecars.mutual, sidecars.plain] = await startSidecars([
    () => startSidecar({ tls }, { client: { tls: { ca: certificates.pem('ca.pem') } } }),
    () => startSidecar({ tls: mutual }, { client: { tls: clientTls() } }),
    () => startSidecar({}),
  ]);
});

after(async () => {
  for (const sidecar of Object.values(sidecars)) await sidecar?.stop();
  certificates?.remove();
});

/** TLS options with the test CA and the client certificate (mutual TLS). */
function clientTls() {
  return {
    ca: certificates.pem('ca.pem'),
    cert: certificates.pem('client.pem'),
    key: certificates.pem('client.key'),
  };
}

/** The error of a unary call and of a turn through a client made with `options`. */
async function failures(options) {
  const client = new TurnwireClient({ timeoutMs: 10_000, ...options });
  try {
    const unary = await client.listConversations().then(
      () => assert.fail('the call succeeded'),
      (error) => error,
    );
    const turn = await client
      .chat('tls-mismatch', 'hi')
      .collect()
      .then(
        () => assert.fail('the turn ran'),
        (error) => error,
      );
    return [unary, turn];
  } finally {
    client.close();
  }
}

test('a plaintext client of a TLS sidecar is told the sidecar wants TLS', async () => {
  for (const error of await failures({ address: sidecars.tls.address })) {
    assert.equal(error.code, 'UNAVAILABLE', error.message);
    assert.match(error.message, /wants TLS, and this client connected in plaintext: pass `tls: true`/);
  }
});

test('a TLS client without a certificate of a mutual-TLS sidecar is told to present one', async () => {
  const address = sidecars.mutual.address;
  for (const error of await failures({ address, tls: { ca: certificates.pem('ca.pem') } })) {
    assert.equal(error.code, 'UNAVAILABLE', error.message);
    assert.match(error.message, /wants a client certificate \(mutual TLS\).*pass `tls: \{ cert, key \}`/);
  }
  // With the certificate the same sidecar answers.
  const client = new TurnwireClient({ address, tls: clientTls() });
  try {
    assert.ok(await client.listConversations());
  } finally {
    client.close();
  }
});

test('a TLS client of a plaintext sidecar is told the sidecar does not speak TLS', async () => {
  const options = { address: sidecars.plain.address, tls: { ca: certificates.pem('ca.pem') } };
  for (const error of await failures(options)) {
    assert.equal(error.code, 'UNAVAILABLE', error.message);
    assert.match(error.message, /does not speak TLS \(it serves plaintext\): connect without `tls`/);
  }
});
