// The client part: runs turns through the sidecar's ChatService and prints what streams back.

import { toStruct, userMessage } from './proto.mjs';

/**
 * Runs one Chat turn and resolves with its events (TurnEvent objects) once the stream ends.
 * `print` gets one readable line per event worth showing.
 */
export function chat(client, { conversationId, text, body = {}, model = '', requestId = '' }, print = () => {}) {
  return new Promise((resolve, reject) => {
    const events = [];
    const stream = client.Chat({ conversationId, requestId, model, message: userMessage(text), body: toStruct(body) });
    let line = '';
    stream.on('data', ({ event }) => {
      events.push(event);
      if (event.event === 'textDelta') {
        line += event.textDelta.delta;
        return;
      }
      if (line) {
        print(`  assistant: ${line}`);
        line = '';
      }
      const shown = describe(event);
      if (shown) print(`  ${shown}`);
    });
    stream.on('error', reject);
    stream.on('end', () => resolve(events));
  });
}

function describe(event) {
  const e = event[event.event];
  switch (event.event) {
    case 'turnStart':
      return `turn ${event.requestId} started (model ${e.model})`;
    case 'toolInputAvailable':
      return `tool call ${e.toolName}(${e.inputJson ?? ''})`;
    case 'toolOutputAvailable':
      return `${e.preliminary ? 'progress' : 'result'}: ${e.outputJson}`;
    case 'toolOutputError':
      return `tool error: ${e.errorText}`;
    case 'turnEnd':
      return `turn ended ${e.status}${e.error ? `: ${e.error.message}` : ''}`;
    default:
      return '';
  }
}
