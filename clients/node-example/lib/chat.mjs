// The client part: runs turns through the sidecar with @turnwire/client and prints what streams back.

import { TurnStatus } from '@turnwire/client';

/**
 * Runs one Chat turn and resolves with its events (TurnEvent messages) once the stream ends.
 * `print` gets one readable line per event worth showing.
 *
 * @param {import('@turnwire/client').TurnwireClient} client
 */
export async function chat(client, { conversationId, text, body = {}, model = '' }, print = () => {}) {
  const events = [];
  let line = '';
  for await (const event of client.chat(conversationId, text, { body, model })) {
    events.push(event);
    if (event.event.case === 'textDelta') {
      line += event.event.value.delta;
      continue;
    }
    if (line) {
      print(`  assistant: ${line}`);
      line = '';
    }
    const shown = describe(event);
    if (shown) print(`  ${shown}`);
  }
  return events;
}

function describe(event) {
  const e = event.event.value;
  switch (event.event.case) {
    case 'turnStart':
      return `turn ${event.requestId} started (model ${e.model})`;
    case 'toolInputAvailable':
      return `tool call ${e.toolName}(${e.inputJson ?? ''})`;
    case 'toolOutputAvailable':
      return `${e.preliminary ? 'progress' : 'result'}: ${e.outputJson}`;
    case 'toolOutputError':
      return `tool error: ${e.errorText}`;
    case 'turnEnd':
      return `turn ended ${TurnStatus[e.status]}${e.error ? `: ${e.error.message}` : ''}`;
    default:
      return '';
  }
}
