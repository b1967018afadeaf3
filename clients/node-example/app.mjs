#!/usr/bin/env node
// The Turnwire Node.js example: a hook server, a tool host and a chat client in one program.
//
//   node app.mjs serve [--listen 127.0.0.1:7001] [--sidecar 127.0.0.1:50051] [--journal FILE]
//   node app.mjs chat  [--sidecar 127.0.0.1:50051] [--conversation ID]
//
// `serve` answers the sidecar's hook calls and runs its tools until SIGINT/SIGTERM, printing a
// line per finished turn; `chat` holds a short conversation through the sidecar. See README.md.

import { parseArgs } from 'node:util';

import { TurnwireClient } from '@turnwire/client';
import { hooks, serve } from '@turnwire/client/kit';

import { chat } from './lib/chat.mjs';
import { createHooks } from './lib/hooks.mjs';
import { Journal } from './lib/journal.mjs';
import { journaled } from './lib/tools.mjs';

const OPTIONS = {
  listen: { type: 'string', default: '127.0.0.1:7001' },
  sidecar: { type: 'string', default: '127.0.0.1:50051' },
  journal: { type: 'string' },
  conversation: { type: 'string', default: `node-example-${Date.now()}` },
};

async function serveCommand({ listen, sidecar, journal: file }) {
  const journal = new Journal(file);
  const client = new TurnwireClient({ address: sidecar });
  const served = await serve({
    listen,
    // beforeStep only journals and onChatResponse only records the finished turn: observed, so
    // the sidecar waits for neither (hooks() option observe); the client gets TurnEnd meanwhile.
    hooks: hooks(createHooks({ journal, client, log: (line) => console.log(line) }), {
      observe: ['beforeStep', 'onChatResponse'],
    }),
    tools: journaled(journal),
  });
  console.log(`hooks and tools listening on ${served.address}`);
  const stop = async () => {
    const turns = journal.entries.filter((e) => e.rpc === 'OnChatResponse').length;
    console.log(`stopping: ${journal.entries.length} calls recorded, ${turns} turns`);
    await served.close();
    client.close();
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

// The turns of the example conversation. `model` picks a script of the sidecar's offline model
// (turnwire.yaml), which decides which tools get called; `body` reaches every hook.
const TURNS = [
  { text: 'Where is my order a-17? Pack it too.', model: 'scripted:orders', body: { user: 'ada', plan: 'pro' } },
  { text: 'Refund it, please.', model: 'scripted:refund', body: { user: 'ada' } },
  { text: 'Pack it again, as a dry run.', model: 'scripted:pack', body: { user: 'ada', dry_run: true } },
];

async function chatCommand({ sidecar, conversation }) {
  const client = new TurnwireClient({ address: sidecar });
  try {
    for (const turn of TURNS) {
      console.log(`user: ${turn.text}  (body ${JSON.stringify(turn.body)})`);
      await chat(client, { conversationId: conversation, ...turn }, console.log);
    }
  } finally {
    client.close();
  }
}

const [command, ...rest] = process.argv.slice(2);
const { values } = parseArgs({ args: rest, options: OPTIONS });
if (command === 'serve') await serveCommand(values);
else if (command === 'chat') await chatCommand(values);
else {
  console.error('usage: node app.mjs serve|chat [--listen HOST:PORT] [--sidecar HOST:PORT] [--journal FILE] [--conversation ID]');
  process.exit(2);
}
