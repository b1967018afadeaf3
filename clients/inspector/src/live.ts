// A running turn's live tail: its events through ResumeTurn, turned into bars timed by when the
// page received them (a running turn has no stored timeline yet; the stored one replaces this
// chart once the turn ends). Events replayed from before the page attached arrive at once.

import { Api, Json } from './api.js';
import { Bar } from './gantt.js';

export class LiveTimeline {
  readonly bars: Bar[] = [];
  private readonly origin = performance.now();
  private readonly open = new Map<string, Bar>();
  private step = -1;

  private now(): number {
    return Math.round((performance.now() - this.origin) * 1000);
  }

  private begin(key: string, kind: string, name: string, details: string[]): void {
    const bar: Bar = { kind, name, startUs: this.now(), durationUs: 0, details, open: true };
    this.bars.push(bar);
    this.open.set(key, bar);
  }

  private end(key: string, outcome = ''): void {
    const bar = this.open.get(key);
    if (!bar) return;
    bar.open = false;
    bar.durationUs = this.now() - bar.startUs;
    if (outcome) bar.details.push(`outcome: ${outcome}`);
    this.open.delete(key);
  }

  // Grow the open bars to now (called on every event and on a timer).
  tick(): void {
    const now = this.now();
    for (const bar of this.open.values()) bar.durationUs = now - bar.startUs;
  }

  // Take one TurnEvent; true when it ended the turn.
  take(event: Json): boolean {
    this.tick();
    if (event.stepStart) {
      this.step = Number(event.stepStart.stepNumber ?? 0);
      this.begin(`step`, 'STEP', `step ${this.step}`, [`step ${this.step} (live)`]);
      // Named by the model the step runs on (a fallback's too), as the stored timeline names it.
      const model = String(event.stepStart.model || `step ${this.step}`);
      this.begin(`model`, 'MODEL', model, [`model stream of step ${this.step} (live)`]);
    } else if ((event.textDelta || event.reasoningDelta) && this.open.has('model')) {
      const model = this.open.get('model')!;
      if (model.firstTokenUs === undefined) model.firstTokenUs = this.now();
    } else if (event.toolInputAvailable) {
      this.end('model');
      const call = event.toolInputAvailable;
      this.begin(`tool:${call.toolCallId}`, 'TOOL', call.toolName, [
        `tool ${call.toolName} (live)`,
        `tool call ${call.toolCallId}`,
      ]);
    } else if (event.toolOutputAvailable || event.toolOutputError || event.toolOutputDenied) {
      const output = event.toolOutputAvailable ?? event.toolOutputError ?? event.toolOutputDenied;
      this.end(`tool:${output.toolCallId}`, event.toolOutputAvailable ? 'output' : 'error');
    } else if (event.stepFinish) {
      this.end('model');
      for (const key of [...this.open.keys()]) if (key.startsWith('tool:')) this.end(key);
      this.end('step', event.stepFinish.finishReason ?? '');
    } else if (event.turnEnd) {
      for (const key of [...this.open.keys()]) this.end(key, 'ended');
      return true;
    }
    return false;
  }
}

// Follow `requestId` until its TurnEnd, calling `changed` as the bars change.
export async function tail(
  api: Api,
  requestId: string,
  live: LiveTimeline,
  changed: () => void,
  signal: AbortSignal,
): Promise<void> {
  const timer = setInterval(() => {
    live.tick();
    changed();
  }, 250);
  try {
    for await (const response of api.stream('ResumeTurn', { requestId, afterSequenceNumber: '0' }, signal)) {
      const ended = live.take(response.event ?? {});
      changed();
      if (ended) return;
    }
  } finally {
    clearInterval(timer);
  }
}
