// What the client's connection options put on the wire, against a stand-in
// gRPC endpoint (node:http2 over TLS, certificates made with the openssl CLI):
// the server certificate is verified against `tls.ca`, `tls.cert`/`tls.key`
// are presented for mutual TLS, `token` arrives as `authorization: Bearer …`,
// and a trailers-only error's google.rpc details (ErrorInfo, RetryInfo) are
// decoded. The sidecar's own TLS and auth are tested on the server side.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http2 from 'node:http2';

import { create, toBinary } from '@bufbuild/protobuf';
import { anyPack, durationFromMs } from '@bufbuild/protobuf/wkt';
import { TurnwireClient, TurnwireError } from '@turnwire/client';
import { ErrorInfoSchema, RetryInfoSchema } from '@turnwire/client/gen/google/rpc/error_details_pb';
import { StatusSchema } from '@turnwire/client/gen/google/rpc/status_pb';

import { makeCertificates } from './certificates.mjs';

let certificates;
let pem;
let server;
let address;
const seen = [];

before(async () => {
  certificates = makeCertificates();
  pem = certificates.pem;

  const details = toBinary(
    StatusSchema,
    create(StatusSchema, {
      code: 8,
      message: 'too many turns',
      details: [
        anyPack(
          ErrorInfoSchema,
          create(ErrorInfoSchema, { reason: 'OVERLOADED', domain: 'turnwire.dev', metadata: { limit: '4' } }),
        ),
        anyPack(RetryInfoSchema, create(RetryInfoSchema, { retryDelay: durationFromMs(1500) })),
      ],
    }),
  );
  server = http2.createSecureServer({
    key: pem('server.key'),
    cert: pem('server.pem'),
    ca: pem('ca.pem'),
    requestCert: true,
    rejectUnauthorized: false, // record whether the client presented one instead
  });
  server.on('stream', (stream, headers) => {
    const peer = stream.session.socket.getPeerCertificate();
    seen.push({
      path: headers[':path'],
      authorization: headers.authorization,
      clientCert: peer?.subject?.CN,
    });
    stream.resume();
    // A trailers-only response: the whole status in the headers (gRPC over HTTP/2, "Trailers-Only").
    stream.respond(
      {
        ':status': 200,
        'content-type': 'application/grpc',
        'grpc-status': '8',
        'grpc-message': 'too many turns',
        'grpc-status-details-bin': Buffer.from(details).toString('base64').replace(/=+$/, ''),
      },
      { endStream: true },
    );
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  address = `127.0.0.1:${server.address().port}`;
});

after(() => {
  server?.close();
  certificates?.remove();
});

test('TLS with a private CA, a client certificate and a bearer token; RetryInfo decoded', async () => {
  const client = new TurnwireClient({
    address,
    tls: { ca: pem('ca.pem'), cert: pem('client.pem'), key: pem('client.key') },
    token: 's3cret',
  });
  try {
    await assert.rejects(client.listConversations(), (error) => {
      assert.ok(error instanceof TurnwireError, String(error));
      assert.equal(error.code, 'RESOURCE_EXHAUSTED');
      assert.equal(error.reason, 'OVERLOADED');
      assert.deepEqual(error.metadata, { limit: '4' });
      assert.equal(error.retryDelayMs, 1500);
      return true;
    });
  } finally {
    client.close();
  }
  assert.deepEqual(seen.at(-1), {
    path: '/turnwire.v1.ChatService/ListConversations',
    authorization: 'Bearer s3cret',
    clientCert: 'client',
  });
});

// Connect reports a failed TLS verification as INTERNAL (grpc-js says UNAVAILABLE); retrying will not help.
test('a server certificate from an untrusted CA fails the call (INTERNAL), nothing is sent', async () => {
  const before = seen.length;
  const client = new TurnwireClient({ address, tls: true, token: 's3cret' });
  try {
    await assert.rejects(client.listConversations(), (error) => {
      assert.ok(error instanceof TurnwireError, String(error));
      assert.equal(error.code, 'INTERNAL');
      assert.match(error.message, /certificate/);
      return true;
    });
  } finally {
    client.close();
  }
  assert.equal(seen.length, before);
});
