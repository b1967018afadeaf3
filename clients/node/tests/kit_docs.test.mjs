// docs/api/kit-typescript.md's first ```ts block, as a reader would use it: type-checked against
// the built @turnwire/client/kit (strict, with docs/tools.md's tool host block), saved as kit.mts and
// compiled by the page's own `tsc` command line, then run as a hook server and tool host under a real
// `turnwire serve` whose scripted model calls its tools: the policy blocks a refund for a non-admin
// and lets an admin's through, the streaming tool's progress and result reach the client.
//
// Run: npm test -w @turnwire/client (after npm run build -w @turnwire/client), or `make test`.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { promisify } from 'node:util';

import ts from 'typescript';
import { TurnwireClient } from '@turnwire/client';

import { freePort, startSidecar } from './sidecar.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const DOCS = path.resolve(HERE, '..', '..', '..', 'docs');
const PAGE = path.join(DOCS, 'api', 'kit-typescript.md');
const BLOCK = /^```ts\n([\s\S]*?)^```/m;
// The page's command that compiles and starts the program (a block of its own).
const COMMAND = /^```sh\n(npx tsc .*) && node (\S+)\n```/m;
const TSC = path.resolve(HERE, '..', '..', '..', 'node_modules', '.bin', 'tsc');
const ADDRESS = '127.0.0.1:7001';

let dir;
let snippet;
let sidecar;
let client;

before(async () => {
  const [, code] = (await readFile(PAGE, 'utf8')).match(BLOCK);
  const [, toolsPage] = (await readFile(path.join(DOCS, 'tools.md'), 'utf8')).match(BLOCK);
  const port = await freePort();
  // Inside this package, so that `@turnwire/client/kit` resolves to it (a self-reference).
  dir = await mkdtemp(path.join(HERE, '.kit-docs-'));
  const source = path.join(dir, 'snippet.ts');
  await writeFile(source, `${code.replaceAll(ADDRESS, `127.0.0.1:${port}`)}\nexport { server };\n`);
  await writeFile(path.join(dir, 'tools_page.ts'), `${toolsPage}\nexport {};\n`);
  const program = ts.createProgram([source, path.join(dir, 'tools_page.ts')], {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    types: ['node'],
    skipLibCheck: true,
  });
  const problems = ts
    .getPreEmitDiagnostics(program)
    .map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
  assert.deepEqual(problems, [], "the pages' snippets type-check");
  // Compiled as the page says (`npx tsc …`: this repository's tsc), into the file it runs.
  const [, compile, run] = (await readFile(PAGE, 'utf8')).match(COMMAND) ?? [];
  assert.ok(compile, 'the page says how to compile and start the program');
  const [command, ...args] = compile.split(' ').slice(1);
  assert.equal(command, 'tsc');
  await writeFile(path.join(dir, args.at(-1)), await readFile(source, 'utf8'));
  await promisify(execFile)(TSC, args, { cwd: dir });
  snippet = await import(pathToFileURL(path.join(dir, run)).href);

  const address = `127.0.0.1:${port}`;
  sidecar = await startSidecar({
    providers: {
      scripted: {
        scripts: {
          orders: [
            {
              tool_calls: [
                { name: 'refund_order', input: { order_id: 'A-17' } },
                { name: 'pack_order', input: { order_id: 'A-17', items: 2 } },
              ],
            },
            { text: 'Done.' },
          ],
        },
      },
    },
    middleware: [{ remote: { address, name: 'policy', failure_mode: { before_tool_call: 'closed' } } }],
    tools: { demo: false, hosts: [{ name: 'orders', address }] },
  });
  client = new TurnwireClient({ address: sidecar.address });
});

after(async () => {
  client?.close();
  await sidecar?.stop();
  await snippet?.server.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** The turn's tool events: [tool, kind, JSON text or error text], in stream order. */
async function toolEvents(body) {
  const seen = [];
  const names = new Map();
  for await (const { event } of client.chat(`docs-${body.role}`, 'go', { model: 'scripted:orders', body })) {
    if (event.case === 'toolInputAvailable') names.set(event.value.toolCallId, event.value.toolName);
    const name = () => names.get(event.value.toolCallId);
    if (event.case === 'toolOutputAvailable')
      seen.push([name(), event.value.preliminary ? 'progress' : 'result', event.value.outputJson]);
    if (event.case === 'toolOutputError') seen.push([name(), 'error', event.value.errorText]);
  }
  return seen;
}

test("the page's policy blocks a refund for a user and the tool streams its progress", async () => {
  const events = await toolEvents({ role: 'user' });
  const refund = events.filter(([tool]) => tool === 'refund_order');
  assert.equal(refund.length, 1);
  assert.match(refund[0][2], /Refunds need an admin/);
  assert.deepEqual(
    events.filter(([tool]) => tool === 'pack_order'),
    [
      ['pack_order', 'progress', '{"order_id":"A-17","packed":1,"of":2}'],
      ['pack_order', 'progress', '{"order_id":"A-17","packed":2,"of":2}'],
      // The sidecar streams the final result as the last progress too, then as the result.
      ['pack_order', 'progress', '{"order_id":"A-17","packed":2,"done":true}'],
      ['pack_order', 'result', '{"order_id":"A-17","packed":2,"done":true}'],
    ],
  );
});

test("the page's policy lets an admin's refund run, with its idempotency key", async () => {
  const [[, kind, output]] = (await toolEvents({ role: 'admin' })).filter(
    ([tool]) => tool === 'refund_order',
  );
  assert.equal(kind, 'result');
  const result = JSON.parse(output);
  assert.equal(result.refunded, true);
  assert.match(result.key, /^tw-k-[0-9a-f]{32}$/);
});
