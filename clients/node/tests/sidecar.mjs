// Starts a real `turnwire serve` process for the client's tests (and for a
// conformance runner): a free port on 127.0.0.1, a throwaway SQLite store, an
// optional config (JSON is YAML), ready once ListConversations answers.
//
// TURNWIRE_BIN overrides the server command (default: the repo's .venv/bin/turnwire).

import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

import { TurnwireClient } from '@turnwire/client';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
export const TURNWIRE_BIN = process.env.TURNWIRE_BIN || path.join(REPO, '.venv', 'bin', 'turnwire');

/**
 * Polls `probe` (every 50 ms) until it returns a value other than undefined/null/false, and
 * returns that value; throws naming `what` (and the last error) after `timeoutMs`.
 */
export async function waitUntil(probe, { timeoutMs = 10_000, what = 'the condition' } = {}) {
  const giveUp = Date.now() + timeoutMs;
  let lastError;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined && value !== null && value !== false) return value;
    } catch (error) {
      lastError = error;
    }
    if (Date.now() > giveUp) {
      throw new Error(
        `timed out after ${timeoutMs} ms waiting for ${what}${lastError ? `: ${lastError.message}` : ''}`,
      );
    }
    await delay(50); // the poll interval, not a guessed wait
  }
}

/** An unused TCP port on 127.0.0.1 (free when asked). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.unref();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

/** How many starts a sidecar gets when other processes take its port (as the Go and Python
 * helpers: `clients/go/internal/sidecar`, `tests/support/sidecar.py`). */
const PORT_ATTEMPTS = 3;

/** A start that failed because another process took the port between the probe and the listen. */
class PortTaken extends Error {}

/**
 * A running sidecar: `address` (host:port), `stderrTail()`, and `stop()`, which sends SIGTERM
 * and resolves with the exit code (SIGKILL and a throw after 15 s). `client`: options of the
 * client that checks it is ready (`tls` for a TLS sidecar). `startupTimeoutMs` is a deadline, not a
 * speed target: a loaded 2-core CI has taken over 30 s to start a sidecar (as tests/support/sidecar.py).
 * A port another process took before the sidecar listened (tests running in parallel, outgoing
 * connections given an ephemeral port) is tried again on another, up to `PORT_ATTEMPTS` starts;
 * `port` (default `freePort`) gives each start's port.
 */
export async function startSidecar(config = {}, options = {}) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOnce(config, options);
    } catch (error) {
      if (!(error instanceof PortTaken) || attempt >= PORT_ATTEMPTS) throw error;
    }
  }
}

/**
 * Starts the sidecars of `starts` (functions each starting one) together and returns them in
 * order; when one fails, stops those that started (no process is left behind to keep the test
 * run alive) and throws the first failure.
 */
export async function startSidecars(starts) {
  const results = await Promise.allSettled(starts.map((start) => start()));
  const failed = results.find((result) => result.status === 'rejected');
  if (failed === undefined) return results.map((result) => result.value);
  await Promise.all(
    results.filter((result) => result.status === 'fulfilled').map((result) => result.value.stop()),
  );
  throw failed.reason;
}

async function startOnce(config, { startupTimeoutMs = 60_000, client = {}, port: nextPort = freePort }) {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'turnwire-ts-client-'));
  const configPath = path.join(dir, 'turnwire.yaml');
  await writeFile(configPath, JSON.stringify(config));
  const port = await nextPort();
  const address = `127.0.0.1:${port}`;
  // The test owns the configuration: drop the caller's TURNWIRE_* settings.
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([name]) => !name.startsWith('TURNWIRE_')),
  );
  env.TURNWIRE_LIMITS__DRAIN_SECONDS = '0'; // no load balancer to drain from: stop at once
  // The conformance suite's configs/webhooks.json signs with it (a public test value).
  env.CONFORMANCE_WEBHOOK_SECRET ??= 'whsec_Y29uZm9ybWFuY2Ugc3VpdGUgdGVzdCBzZWNyZXQgb25seQ==';
  const child = spawn(
    TURNWIRE_BIN,
    [
      'serve',
      '--listen',
      address,
      '--store',
      `sqlite:///${path.join(dir, 'turnwire.db')}`,
      '--config',
      configPath,
    ],
    { cwd: dir, env, stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (chunk) => {
    stderr = (stderr + chunk).slice(-64_000);
  });
  let exited = null;
  const exit = new Promise((resolve) => {
    child.on('error', (error) => resolve((exited = { code: null, error })));
    child.on('exit', (code, signal) => resolve((exited = { code, signal })));
  });
  const stderrTail = () => (stderr ? `\n--- turnwire stderr (tail) ---\n${stderr.slice(-4000)}` : '');

  const stop = async () => {
    try {
      if (exited) return exited.code;
      child.kill('SIGTERM');
      const timer = new AbortController();
      const result = await Promise.race([
        exit,
        delay(15_000, 'timeout', { signal: timer.signal }).catch(() => null),
      ]);
      timer.abort();
      if (result === 'timeout') {
        child.kill('SIGKILL');
        throw new Error(`turnwire did not exit within 15 s of SIGTERM${stderrTail()}`);
      }
      return result.code;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  };

  const probe = new TurnwireClient({ address, timeoutMs: 1000, ...client });
  try {
    const ready = await waitUntil(
      async () =>
        exited ??
        (await probe.listConversations({ pageSize: 1 }),
        // Answered by this process (its own announcement), not by another test's sidecar that
        // took the same port first (this one then exits: cannot listen).
        stderr.includes(`turnwire listening on ${address}`) ? 'ready' : null),
      { timeoutMs: startupTimeoutMs, what: `turnwire serve on ${address}` },
    );
    if (ready !== 'ready')
      throw new Error(`turnwire (${TURNWIRE_BIN}) exited before it was ready: ${JSON.stringify(ready)}`);
  } catch (error) {
    await stop();
    const Failure = stderr.includes('cannot listen on') ? PortTaken : Error;
    throw new Failure(`${error.message}${stderrTail()}`);
  } finally {
    probe.close();
  }
  return { address, stop, stderrTail };
}
