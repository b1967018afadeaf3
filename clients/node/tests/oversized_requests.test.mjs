// Issue 32 item 14 against a real `turnwire serve` whose limits.max_receive_message_bytes (1 MiB) is
// below the client's maxSendMessageBytes (16 MiB by default): a request between the two is refused
// by the sidecar, which stops reading it. Some sizes came back RESOURCE_EXHAUSTED; a 15 MB one hung
// forever (the sidecar closed the stream with NO_ERROR before any response, which connect-node
// does not count as an end). Every such request now ends at once, and the connection stays usable.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { TurnwireClient } from '@turnwire/client';

import { startSidecar } from './sidecar.mjs';

const LIMIT = 1024 * 1024;

let sidecar;
let client;

before(async () => {
  sidecar = await startSidecar({ limits: { max_receive_message_bytes: LIMIT, max_message_bytes: LIMIT } });
  client = new TurnwireClient({ address: sidecar.address, timeoutMs: 30_000 });
});

after(async () => {
  client?.close();
  if (sidecar)
    assert.equal(await sidecar.stop(), 0, `turnwire exit code after SIGTERM${sidecar.stderrTail()}`);
});

// The timeout makes the old hang a failure instead of a stuck run.
test(
  'a request over the sidecar limit but under the client one ends RESOURCE_EXHAUSTED, whatever its size',
  { timeout: 90_000 },
  async () => {
    for (const size of [2_000_000, 8_000_000, 15_000_000]) {
      const error = await client
        .chat('ts-oversized', 'y'.repeat(size))
        .collect()
        .then(
          () => assert.fail(`a ${size}-byte message was accepted`),
          (thrown) => thrown,
        );
      assert.equal(error.code, 'RESOURCE_EXHAUSTED', `${size} bytes: ${error.message}`);
      assert.match(error.message, /max_receive_message_bytes|larger than max/, `${size} bytes`);
      // The connection is still good for the next call.
      const { status } = await client.chat('ts-oversized-after', 'hello').collect();
      assert.equal(status, 'COMPLETED', `after ${size} bytes`);
    }
  },
);
