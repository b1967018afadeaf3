// AG-UI's own client, `@ag-ui/client`'s HttpAgent (1.0.0, unmodified, pinned in package.json; it
// runs on Node.js 20), against the sidecar's AG-UI door. Run by tests/e2e/test_ag_ui_door_e2e.py:
//
//   node tests/support/ag_ui_node.mjs SPEC_JSON
//
// SPEC: {url, token, threadId, runs: [{runId?, model?, text?, tools?, answerPending?, abortOn?}]}.
// One agent (one thread) makes the runs in order, as an app does: a run with `text` adds that user
// message first; one with `answerPending` (the client running its tool) adds a tool message with
// that content for each tool call the previous run left pending (RUN_FINISHED's
// outcome.pendingToolCallIds); `abortOn` aborts the run (agent.abortRun) at the first event of that
// type. It prints one JSON object: for each run the events the agent saw (after its own verification
// and schema parsing), its new messages, and the error it raised (status and payload for an HTTP
// refusal); and the agent's messages at the end.

import { HttpAgent } from '@ag-ui/client';

const spec = JSON.parse(process.argv[2]);
const agent = new HttpAgent({
  url: spec.url,
  threadId: spec.threadId,
  headers: spec.token ? { Authorization: `Bearer ${spec.token}` } : {},
});
const seen = { runs: [] };
let pending = [];
for (const [index, run] of spec.runs.entries()) {
  if (run.text !== undefined) agent.addMessage({ id: `${spec.threadId}-u${index}`, role: 'user', content: run.text });
  if (run.answerPending !== undefined) {
    for (const toolCallId of pending) {
      agent.addMessage({ id: `${toolCallId}-answer`, role: 'tool', toolCallId, content: run.answerPending });
    }
  }
  const events = [];
  const outcome = { events };
  try {
    const result = await agent.runAgent(
      {
        runId: run.runId,
        tools: run.tools ?? [],
        forwardedProps: run.model ? { model: run.model } : {},
      },
      {
        onEvent: ({ event }) => {
          events.push(event);
          if (run.abortOn === event.type) agent.abortRun();
        },
      },
    );
    outcome.newMessages = result.newMessages;
  } catch (error) {
    outcome.error = { message: String(error.message ?? error), status: error.status ?? null, payload: error.payload ?? null };
  }
  const finished = events.find((event) => event.type === 'RUN_FINISHED');
  pending = finished?.outcome?.pendingToolCallIds ?? [];
  seen.runs.push(outcome);
}
seen.messages = agent.messages;
process.stdout.write(JSON.stringify(seen));
