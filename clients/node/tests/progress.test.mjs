// Progress keepalives (issue 18, liveness) through a real `turnwire serve`
// process: a turn whose model is silent for 2.5 s, with
// limits.progress_interval_seconds 0.5, streams Progress events (sequence
// number 0, not part of the turn's stream). The client skips them by default;
// `includeProgress: true` yields them, and collect() ignores them either way.
//
// Run: npm test -w @turnwire/client (after npm run build -w @turnwire/client), or `make test`.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { ProgressPhase, TurnwireClient } from '@turnwire/client';

import { startSidecar } from './sidecar.mjs';

const CONFIG = {
  limits: { progress_interval_seconds: 0.5 },
  // One word after 2.5 s of silence: the model "thinking".
  providers: { scripted: { scripts: { silent: [{ text: 'late', delay_ms: 2500 }] } } },
};

let sidecar;
let plain;
let withProgress;

before(async () => {
  sidecar = await startSidecar(CONFIG);
  plain = new TurnwireClient({ address: sidecar.address });
  withProgress = new TurnwireClient({ address: sidecar.address, includeProgress: true });
});

after(async () => {
  plain?.close();
  withProgress?.close();
  if (sidecar)
    assert.equal(await sidecar.stop(), 0, `turnwire exit code after SIGTERM${sidecar.stderrTail()}`);
});

async function eventsOf(stream) {
  const events = [];
  for await (const event of stream) events.push(event);
  return events;
}

test('a silent turn streams Progress events only to a client that asks for them', async () => {
  const [skipped, seen] = await Promise.all([
    eventsOf(plain.chat('ts-plain', 'think', { model: 'scripted:silent' })),
    eventsOf(withProgress.chat('ts-progress', 'think', { model: 'scripted:silent', requestId: 'ts-p' })),
  ]);
  assert.equal(skipped.at(-1).event.case, 'turnEnd');
  assert.ok(!skipped.some((e) => e.event.case === 'progress'));
  assert.deepEqual(
    skipped.map((e) => e.sequenceNumber),
    skipped.map((_, i) => BigInt(i + 1)),
  );

  const progress = seen.filter((e) => e.event.case === 'progress');
  assert.ok(progress.length > 0, 'no Progress during 2.5 s of silence');
  for (const event of progress) {
    assert.equal(event.sequenceNumber, 0n);
    assert.equal(event.requestId, 'ts-p');
    assert.equal(event.conversationId, 'ts-progress');
    assert.equal(event.event.value.phase, ProgressPhase.MODEL);
  }
  assert.equal(seen.at(-1).event.case, 'turnEnd'); // none after the TurnEnd
});

test('collect() ignores Progress events', async () => {
  const result = await withProgress.chat('ts-collect', 'think', { model: 'scripted:silent' }).collect();
  assert.equal(result.status, 'COMPLETED');
  assert.equal(result.text, 'late');
});
