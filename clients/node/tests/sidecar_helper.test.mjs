// The test helper that starts real `turnwire serve` processes (sidecar.mjs): a port another
// process took before the sidecar listened is tried again on another, and sidecars started
// together are stopped when one of them fails (a sidecar left running keeps the test run alive).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';

import { TurnwireClient } from '@turnwire/client';

import { freePort, startSidecar, startSidecars } from './sidecar.mjs';

test('a port taken before the sidecar listened is tried again on another', async () => {
  const holder = net.createServer();
  await new Promise((resolve) => holder.listen(0, '127.0.0.1', resolve));
  const taken = holder.address().port;
  const ports = [];
  const port = async () => {
    ports.push(ports.length === 0 ? taken : await freePort());
    return ports.at(-1);
  };
  try {
    const sidecar = await startSidecar({}, { port });
    try {
      assert.equal(ports.length, 2);
      assert.equal(sidecar.address, `127.0.0.1:${ports[1]}`);
      const client = new TurnwireClient({ address: sidecar.address });
      try {
        assert.ok(await client.listConversations());
      } finally {
        client.close();
      }
    } finally {
      await sidecar.stop();
    }
  } finally {
    holder.close();
  }
});

test('sidecars started together are stopped when one of them fails', async () => {
  let stopped = false;
  const started = async () => {
    const sidecar = await startSidecar({});
    const stop = sidecar.stop;
    sidecar.stop = () => {
      stopped = true;
      return stop();
    };
    return sidecar;
  };
  await assert.rejects(
    startSidecars([started, async () => Promise.reject(new Error('this one could not start'))]),
    /this one could not start/,
  );
  assert.equal(stopped, true);
});
