// What the browser entry's TurnwireWebClient puts on the wire and reads back, against a stand-in
// HTTP/1.1 endpoint (node:http): the Connect protocol by default (a JSON POST to the method's
// path) or gRPC-Web, `token` as `authorization: Bearer …`, and an error's google.rpc details
// (ErrorInfo, RetryInfo) decoded from a Connect JSON error body and from gRPC-Web trailers. The
// sidecar's own HTTP listener is tested on the server side and by the conformance suite.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';

import { create, toBinary } from '@bufbuild/protobuf';
import { anyPack, durationFromMs } from '@bufbuild/protobuf/wkt';
import { TurnwireError } from '@turnwire/client';
import { TurnwireWebClient, TurnwireError as WebError } from '@turnwire/client/web';
import { ErrorInfoSchema, RetryInfoSchema } from '@turnwire/client/gen/google/rpc/error_details_pb';
import { StatusSchema } from '@turnwire/client/gen/google/rpc/status_pb';

const errorInfo = create(ErrorInfoSchema, {
  reason: 'OVERLOADED',
  domain: 'turnwire.dev',
  metadata: { limit: '4' },
});
const retryInfo = create(RetryInfoSchema, { retryDelay: durationFromMs(1500) });
const base64 = (bytes) => Buffer.from(bytes).toString('base64').replace(/=+$/, '');

let server;
let baseUrl;
const seen = [];

before(async () => {
  server = http.createServer((request, response) => {
    const chunks = [];
    request.on('data', (chunk) => chunks.push(chunk));
    request.on('end', () => {
      seen.push({
        path: request.url,
        contentType: request.headers['content-type'],
        authorization: request.headers.authorization,
        body: Buffer.concat(chunks),
      });
      if (request.headers['content-type'].startsWith('application/grpc-web')) {
        // gRPC-Web: no messages, then the trailers frame (flag 0x80) with the status and details.
        const status = toBinary(
          StatusSchema,
          create(StatusSchema, {
            code: 8,
            message: 'too many turns',
            details: [anyPack(ErrorInfoSchema, errorInfo), anyPack(RetryInfoSchema, retryInfo)],
          }),
        );
        const trailers = Buffer.from(
          `grpc-status: 8\r\ngrpc-message: too%20many%20turns\r\ngrpc-status-details-bin: ${base64(status)}\r\n`,
        );
        const frame = Buffer.alloc(5);
        frame.writeUInt8(0x80, 0);
        frame.writeUInt32BE(trailers.length, 1);
        response.writeHead(200, { 'content-type': 'application/grpc-web+proto' });
        response.end(Buffer.concat([frame, trailers]));
        return;
      }
      // Connect unary error: the HTTP status of the code, a JSON body with the details' bytes.
      response.writeHead(429, { 'content-type': 'application/json' });
      response.end(
        JSON.stringify({
          code: 'resource_exhausted',
          message: 'too many turns',
          details: [
            { type: 'google.rpc.ErrorInfo', value: base64(toBinary(ErrorInfoSchema, errorInfo)) },
            { type: 'google.rpc.RetryInfo', value: base64(toBinary(RetryInfoSchema, retryInfo)) },
          ],
        }),
      );
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseUrl = `http://127.0.0.1:${server.address().port}`;
});

after(() => server?.close());

function assertOverloaded(error) {
  assert.ok(error instanceof TurnwireError, String(error));
  assert.equal(error.code, 'RESOURCE_EXHAUSTED');
  assert.equal(error.reason, 'OVERLOADED');
  assert.deepEqual(error.metadata, { limit: '4' });
  assert.equal(error.retryDelayMs, 1500);
  return true;
}

test('both entries export one error class', () => {
  assert.equal(WebError, TurnwireError);
});

test('Connect: a JSON POST to the method with the bearer token; the error details decoded', async () => {
  const client = new TurnwireWebClient({ baseUrl, token: 's3cret' });
  await assert.rejects(client.cancelChat('r-1'), assertOverloaded);
  const request = seen.at(-1);
  assert.equal(request.path, '/turnwire.v1.ChatService/CancelChat');
  assert.equal(request.contentType, 'application/json');
  assert.equal(request.authorization, 'Bearer s3cret');
  assert.deepEqual(JSON.parse(request.body.toString()), { requestId: 'r-1' });
});

test('gRPC-Web in binary: the details decoded from the trailers; no token, no authorization header', async () => {
  const client = new TurnwireWebClient({ baseUrl, protocol: 'grpc-web', useBinaryFormat: true });
  await assert.rejects(client.cancelChat('r-2'), assertOverloaded);
  const request = seen.at(-1);
  assert.equal(request.path, '/turnwire.v1.ChatService/CancelChat');
  assert.equal(request.contentType, 'application/grpc-web+proto');
  assert.equal(request.authorization, undefined);
});
