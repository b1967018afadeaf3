// The inspector page (docs/inspector.md): conversations, a conversation's transcript, and each
// turn's Gantt chart, read through the API with the bearer token the user gives.
// The token comes from the URL's fragment (#token=…, never sent to a server) or the form, and is
// kept in sessionStorage for this tab only.

import { Api, ApiError, Json } from './api.js';
import { barsOf, drawGantt, formatUs } from './gantt.js';
import { LiveTimeline, tail } from './live.js';
import { drawTranscript } from './transcript.js';

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const status = $('status');
const tooltip = $('tooltip');
let api = new Api('');
let conversations: Json[] = [];
// Each listed conversation's cost line, by id and update time: read once, not per redraw.
const costs = new Map<string, Promise<string>>();
let current = '';
let following: AbortController | null = null;
let watching: number | undefined;
const WATCH_MS = 1500;

function say(text: string, error = false): void {
  status.textContent = text;
  status.classList.toggle('error', error);
}

function failed(error: unknown): void {
  say(error instanceof ApiError ? `${error.code}: ${error.message}` : String(error), true);
}

function fragment(): URLSearchParams {
  return new URLSearchParams(location.hash.slice(1));
}

function setFragment(key: string, value: string): void {
  const params = fragment();
  params.set(key, value);
  history.replaceState(null, '', `#${params}`);
}

async function loadConversations(): Promise<void> {
  conversations = [];
  let pageToken = '';
  do {
    const page = await api.call('ListConversations', { pageSize: 200, pageToken });
    conversations.push(...(page.conversations ?? []));
    pageToken = page.nextPageToken ?? '';
  } while (pageToken && conversations.length < 1000);
  drawConversations();
  say(`${conversations.length} conversation(s)`);
}

function drawConversations(): void {
  const query = ($('search') as HTMLInputElement).value.trim();
  const list = $('conversations');
  list.replaceChildren();
  for (const conversation of conversations.filter((c) => c.conversationId.includes(query))) {
    const item = document.createElement('li');
    const button = document.createElement('button');
    button.className = 'conversation';
    button.dataset.id = conversation.conversationId;
    button.setAttribute('aria-current', String(conversation.conversationId === current));
    const updated = new Date(conversation.updateTime).toLocaleString();
    button.append(conversation.conversationId);
    const meta = document.createElement('span');
    meta.className = 'meta';
    meta.textContent = `${conversation.messageCount ?? 0} messages · ${updated}`;
    meta.dataset.cost = '';
    button.append(meta);
    button.addEventListener('click', () => void openConversation(conversation.conversationId).catch(failed));
    item.append(button);
    list.append(item);
    const key = `${conversation.conversationId}@${conversation.updateTime}`;
    if (!costs.has(key))
      costs.set(
        key,
        api
          .call('GetConversation', { conversationId: conversation.conversationId, pageSize: 1 })
          .then((found) => {
            const cost = found.conversation?.cost;
            return cost ? ` · $${Number(cost.usd ?? 0).toFixed(6)}` : ' · cost unknown';
          })
          .catch(() => ''),
      );
    void costs.get(key)!.then((line) => {
      meta.textContent += line;
    });
  }
}

async function openConversation(conversationId: string): Promise<void> {
  following?.abort();
  following = null;
  clearInterval(watching);
  current = conversationId;
  setFragment('conversation', conversationId);
  drawConversations();
  $('conversation-title').textContent = conversationId;
  say(`loading ${conversationId}…`);
  const messages: Json[] = [];
  const partial = new Map<string, string>();
  let pageToken = '';
  let cost: Json | undefined;
  do {
    const page = await api.call('GetConversation', { conversationId, pageToken });
    const conversation = page.conversation ?? {};
    messages.push(...(conversation.messages ?? []));
    for (const reply of conversation.partialReplies ?? [])
      partial.set(
        reply.messageId,
        String(reply.status ?? 'TURN_STATUS_UNSPECIFIED')
          .replace('TURN_STATUS_', '')
          .toLowerCase()
          .replace('unspecified', 'running'),
      );
    cost = conversation.cost;
    pageToken = page.nextPageToken ?? '';
  } while (pageToken);
  if (conversationId !== current) return; // another one was opened meanwhile: it draws itself
  $('conversation-cost').textContent = cost
    ? `cost $${Number(cost.usd ?? 0).toFixed(6)} (${cost.priceSource ?? ''})`
    : 'cost unknown';
  $('transcript').replaceChildren(drawTranscript(messages, partial));
  await loadTurns();
  if (conversationId !== current) return;
  say(`${messages.length} message(s)`);
  // A turn that starts while the conversation is open is shown (and tailed) as it runs.
  watching = window.setInterval(() => void watch(conversationId), WATCH_MS);
}

async function watch(conversationId: string): Promise<void> {
  if (following || conversationId !== current) return;
  const page = await api.call('ListTurns', { conversationId, pageSize: 1 }).catch(() => ({}) as Json);
  const newest = (page.turns ?? [])[0];
  if (newest && !document.querySelector(`section.turn[data-request-id="${CSS.escape(newest.requestId)}"]`))
    await openConversation(conversationId);
}

function errorText(error: Json | undefined): string {
  if (!error) return '';
  const info = (error.details ?? []).find((detail: Json) =>
    String(detail['@type'] ?? '').endsWith('ErrorInfo'),
  );
  const reason = info?.reason ? `${info.reason}: ` : '';
  const metadata = info?.metadata ? ` ${JSON.stringify(info.metadata)}` : '';
  return `${reason}${error.message ?? ''}${metadata}`;
}

async function loadTurns(): Promise<void> {
  const failedOnly = ($('failed-only') as HTMLInputElement).checked;
  const conversationId = current;
  const page = await api.call('ListTurns', { conversationId, failedOnly, pageSize: 100 });
  if (conversationId !== current) return; // another conversation was opened meanwhile
  const turns: Json[] = page.turns ?? [];
  const box = $('turns');
  box.replaceChildren();
  if (!turns.length)
    box.append(
      Object.assign(document.createElement('p'), {
        textContent: failedOnly ? 'No failed turns.' : 'No turns.',
      }),
    );
  for (const turn of turns) {
    const state = String(turn.status ?? 'TURN_STATUS_UNSPECIFIED')
      .replace('TURN_STATUS_', '')
      .toLowerCase();
    const running = state === 'unspecified';
    const section = document.createElement('section');
    section.className = `turn status-${running ? 'running' : state}`;
    section.dataset.requestId = turn.requestId;
    section.dataset.status = running ? 'running' : state;
    const heading = document.createElement('h3');
    const started = new Date(turn.startTime).toLocaleTimeString();
    const took = turn.endTime
      ? ` · ${formatUs((Date.parse(turn.endTime) - Date.parse(turn.startTime)) * 1000)}`
      : '';
    const cost = turn.cost ? ` · $${Number(turn.cost.usd ?? 0).toFixed(6)}` : '';
    // The models its steps ran on (a fallback's included) when they are not just the one asked for.
    const ran: string[] = turn.stepModels ?? [];
    const model =
      ran.length && (ran.length > 1 || ran[0] !== turn.model)
        ? `${turn.model} → ran on ${ran.join(', ')}`
        : turn.model;
    heading.textContent = `turn ${turn.requestId} · ${running ? 'running' : state} · ${model} · ${started}${took}${cost}`;
    section.append(heading);
    if (turn.error) {
      const error = document.createElement('p');
      error.className = 'turn-error';
      error.textContent = errorText(turn.error);
      section.append(error);
    }
    const chart = document.createElement('div');
    chart.className = 'chart';
    section.append(chart);
    box.append(section);
    if (running) follow(turn.requestId, chart, section);
    else if (turn.timeline)
      drawGantt(chart, barsOf(turn.timeline), `timeline of turn ${turn.requestId}`, tooltip);
    else chart.textContent = 'No stored timeline (the turn ended before timelines were stored).';
  }
}

function follow(requestId: string, chart: HTMLElement, section: HTMLElement): void {
  const controller = new AbortController();
  following = controller;
  section.dataset.live = 'true';
  const live = new LiveTimeline();
  const redraw = () => {
    const svg = drawGantt(chart, live.bars, `live timeline of turn ${requestId}`, tooltip);
    svg.classList.add('live');
  };
  redraw();
  void tail(api, requestId, live, redraw, controller.signal)
    .then(() => {
      if (following === controller) void openConversation(current);
    })
    .catch((error: unknown) => {
      if (!controller.signal.aborted) say(`live tail: ${String(error)}`, true);
    });
}

async function connect(): Promise<void> {
  const token = ($('token') as HTMLInputElement).value.trim();
  sessionStorage.setItem('turnwire-token', token);
  api = new Api(token);
  try {
    await loadConversations();
    const wanted = fragment().get('conversation');
    if (wanted) await openConversation(wanted);
  } catch (error) {
    failed(error);
  }
}

/** The fragment's token, if it has one, taken out of the address (not left in the address bar or
 * history). */
function takeToken(): string | null {
  const params = fragment();
  const token = params.get('token');
  if (token === null) return null;
  params.delete('token');
  history.replaceState(null, '', params.size ? `#${params}` : location.pathname);
  return token;
}

/** A fragment changed in the open tab (a link to another conversation, the address bar, Back):
 * follow it as at load. The page's own changes (`setFragment`) replace it without this event. */
function followFragment(): void {
  const token = takeToken();
  if (token !== null) {
    ($('token') as HTMLInputElement).value = token;
    void connect(); // then opens the fragment's conversation
    return;
  }
  const wanted = fragment().get('conversation');
  if (wanted && wanted !== current) void openConversation(wanted).catch(failed);
}

function start(): void {
  const token = takeToken() ?? sessionStorage.getItem('turnwire-token') ?? '';
  ($('token') as HTMLInputElement).value = token;
  $('connect-form').addEventListener('submit', (event) => {
    event.preventDefault();
    void connect();
  });
  $('search').addEventListener('input', drawConversations);
  $('search-form').addEventListener('submit', (event) => {
    event.preventDefault(); // Enter opens the conversation of exactly that id
    const id = ($('search') as HTMLInputElement).value.trim();
    if (id) void openConversation(id).catch(failed);
  });
  $('failed-only').addEventListener('change', () => {
    if (current) void loadTurns().catch(failed);
  });
  window.addEventListener('hashchange', followFragment);
  void connect();
}

start();
