// Runs the chat snippet at the top of README.md, as written, against a real sidecar: it must
// stream the first reply, print the second turn's tool call with plain JSON input and output,
// and finish (the client closed, nothing left running).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { startSidecar } from './sidecar.mjs';

const PACKAGE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

let sidecar;

before(async () => {
  sidecar = await startSidecar();
});

after(async () => {
  if (sidecar)
    assert.equal(await sidecar.stop(), 0, `turnwire exit code after SIGTERM${sidecar.stderrTail()}`);
});

test("the README's first snippet chats and prints the tool call with plain JSON values", async () => {
  const readme = await readFile(path.join(PACKAGE, 'README.md'), 'utf8');
  const snippet = readme.match(/```js\n([\s\S]*?)```/)[1];
  assert.ok(
    snippet.split('\n').filter((line) => line.trim()).length <= 10,
    'the snippet is ten lines at most',
  );
  // Run from the package directory, where '@turnwire/client' resolves as it does in a project.
  const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '--eval', snippet], {
    cwd: PACKAGE,
    env: { ...process.env, TURNWIRE_ADDRESS: sidecar.address },
    timeout: 60_000,
  });
  assert.match(stdout, /calculator tool\.\n.*12 \* 7 = 84\.\n/);
  assert.match(stdout, /get_weather \{ city: 'Paris' \} -> \{\s*city: 'Paris',\s*condition: 'windy'/);
  assert.match(stdout, /COMPLETED \[/);
});
