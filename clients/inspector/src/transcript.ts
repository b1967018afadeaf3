// A conversation's transcript with every part: text, reasoning (collapsed), tool calls with their
// exact input and output JSON (shown as stored, so big integers stay intact), approvals,
// provider-executed calls, sources, files (images shown), partial replies marked.

import { Json } from './api.js';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text?: string,
): HTMLElementTagNameMap[K] {
  const created = document.createElement(tag);
  if (className) created.className = className;
  if (text !== undefined) created.textContent = text;
  return created;
}

function toolCall(part: Json): HTMLElement {
  const details = el('details', 'part part-tool');
  details.dataset.toolCallId = part.toolCallId ?? '';
  const state = String(part.state ?? '')
    .replace('TOOL_CALL_STATE_', '')
    .toLowerCase();
  const summary = el('summary', '', `tool ${part.toolName} · ${state}`);
  if (part.providerExecuted) summary.append(el('span', 'badge provider-executed', 'provider-executed'));
  if (part.clientExecuted) summary.append(el('span', 'badge', 'client-executed'));
  const decision = String(part.decision ?? '')
    .replace('TOOL_CALL_DECISION_', '')
    .toLowerCase();
  if (decision && decision !== 'unspecified')
    summary.append(el('span', `badge decision decision-${decision}`, decision));
  details.append(summary);
  details.append(el('h4', '', 'input'));
  details.append(el('pre', 'tool-input', part.inputJson ?? part.rawInput ?? ''));
  if (part.outputJson !== undefined) {
    details.append(el('h4', '', 'output'));
    details.append(el('pre', 'tool-output', part.outputJson));
  }
  if (part.errorText) {
    details.append(el('h4', '', 'error'));
    details.append(el('pre', 'tool-error', part.errorText));
  }
  if (part.approval) {
    const approval = part.approval;
    const answer = approval.approved === undefined ? 'waiting' : approval.approved ? 'approved' : 'denied';
    details.append(
      el(
        'p',
        'approval',
        `approval ${approval.id ?? ''}: ${answer}${approval.reason ? ` (${approval.reason})` : ''}`,
      ),
    );
  }
  return details;
}

function file(part: Json): HTMLElement {
  const box = el('figure', 'part part-file');
  const type = String(part.mediaType ?? '');
  if (part.data && type.startsWith('image/')) {
    const image = el('img');
    image.src = `data:${type};base64,${part.data}`;
    image.alt = part.filename || `an image (${type})`;
    box.append(image);
  } else if (part.url) {
    const link = el('a', '', part.filename || part.url);
    link.href = part.url;
    link.rel = 'noreferrer';
    box.append(link);
  }
  box.append(
    el(
      'figcaption',
      '',
      `file ${part.filename ?? ''} ${type} ${part.sizeBytes ? `${part.sizeBytes} bytes` : ''}`.trim(),
    ),
  );
  return box;
}

function partOf(part: Json): HTMLElement | null {
  if (part.text) return el('p', 'part part-text', part.text.text ?? '');
  if (part.reasoning) {
    const details = el('details', 'part part-reasoning');
    details.append(el('summary', '', part.reasoning.redacted ? 'reasoning (redacted)' : 'reasoning'));
    details.append(el('pre', '', part.reasoning.text ?? ''));
    return details;
  }
  if (part.toolCall) return toolCall(part.toolCall);
  if (part.file) return file(part.file);
  if (part.source) {
    const source = part.source;
    const box = el('p', 'part part-source', 'source: ');
    if (source.url) {
      const link = el('a', '', source.title || source.url);
      link.href = source.url;
      link.rel = 'noreferrer';
      box.append(link);
    } else box.append(source.title || source.filename || source.sourceId || '');
    if (source.citedText) box.append(el('q', '', source.citedText));
    return box;
  }
  if (part.data) return el('pre', 'part part-data', JSON.stringify(part.data));
  if (part.stepStart) return el('hr', 'part part-step');
  return null;
}

// The messages as an <ol>; `partial` maps a message id to how its turn ended.
export function drawTranscript(messages: Json[], partial: Map<string, string>): HTMLOListElement {
  const list = el('ol', 'messages');
  for (const message of messages) {
    const role = String(message.role ?? '')
      .replace('ROLE_', '')
      .toLowerCase();
    const item = el('li', `message role-${role}`);
    item.dataset.id = message.id;
    item.dataset.role = role;
    const head = el('div', 'message-head', `${role} · ${message.id}`);
    const state = partial.get(message.id);
    if (state !== undefined) head.append(el('span', 'badge partial', `partial (${state})`));
    item.append(head);
    for (const part of message.parts ?? []) {
      const shown = partOf(part);
      if (shown) item.append(shown);
    }
    list.append(item);
  }
  return list;
}
