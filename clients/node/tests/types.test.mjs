// The published type declarations (dist/*.d.ts) type-check a TypeScript consumer
// (tests/consumer/consumer.ts) that has no Node.js type definitions (`@types/node`).

import { test } from 'node:test';
import { execFile } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const TSC = createRequire(import.meta.url).resolve('typescript/bin/tsc');

test('a TypeScript consumer type-checks against the declarations', async () => {
  // tsc reports its errors on stdout; a rejection carries them.
  await promisify(execFile)(process.execPath, [TSC, '-p', path.join(HERE, 'consumer', 'tsconfig.json')], {
    timeout: 120_000,
  }).catch((error) => {
    throw new Error(`tsc failed:\n${error.stdout}${error.stderr}`);
  });
});
