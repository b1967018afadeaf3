// A turn's timeline as a Gantt chart in SVG: one row per phase, in the order the phases started,
// each bar as long as the phase took, the first token marked. Hover or focus shows its details.

import { Json } from './api.js';

export interface Bar {
  kind: string; // QUEUE, ATTEMPT, STEP, MODEL, TOOL, HOOK, COMPACTION
  name: string;
  startUs: number;
  durationUs: number;
  firstTokenUs?: number;
  details: string[];
  open?: boolean; // live: still running
}

const SVG = 'http://www.w3.org/2000/svg';
const ROW = 22;
const LABEL = 190;
const WIDTH = 880;
const PLOT = WIDTH - LABEL - 90;

export function barsOf(timeline: Json | undefined): Bar[] {
  return (timeline?.spans ?? []).map((span: Json) => {
    const kind = String(span.kind ?? '').replace('TIMELINE_SPAN_KIND_', '');
    const startUs = Number(span.startOffsetMicros ?? 0);
    const durationUs = Number(span.durationMicros ?? 0);
    const details = [
      `${kind.toLowerCase()} ${span.name}`,
      `starts at ${formatUs(startUs)}`,
      `took ${formatUs(durationUs)}`,
    ];
    if (span.stepNumber !== undefined) details.push(`step ${span.stepNumber}`);
    if (span.attempt) details.push(`attempt ${span.attempt}`);
    if (span.toolCallId) details.push(`tool call ${span.toolCallId}`);
    if (span.detail) details.push(kind === 'HOOK' ? `middleware ${span.detail}` : span.detail);
    if (span.outcome) details.push(`outcome: ${span.outcome}`);
    const bar: Bar = { kind, name: String(span.name ?? ''), startUs, durationUs, details };
    if (span.firstTokenOffsetMicros !== undefined) {
      bar.firstTokenUs = Number(span.firstTokenOffsetMicros);
      details.push(`first token at ${formatUs(bar.firstTokenUs)}`);
    }
    return bar;
  });
}

export function formatUs(us: number): string {
  if (us >= 1_000_000) return `${(us / 1_000_000).toFixed(2)} s`;
  if (us >= 1000) return `${(us / 1000).toFixed(1)} ms`;
  return `${us} µs`;
}

function element(name: string, attributes: Record<string, string | number>, parent?: Element): SVGElement {
  const created = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) created.setAttribute(key, String(value));
  parent?.appendChild(created);
  return created;
}

// Draw `bars` into a new <svg> (replacing `into`'s content); `tooltip` shows a bar's details.
export function drawGantt(
  into: HTMLElement,
  bars: Bar[],
  label: string,
  tooltip: HTMLElement,
): SVGSVGElement {
  const end = Math.max(1, ...bars.map((bar) => bar.startUs + bar.durationUs));
  const scale = PLOT / end;
  const height = ROW * bars.length + 28;
  const svg = element('svg', {
    class: 'gantt',
    viewBox: `0 0 ${WIDTH} ${height}`,
    width: WIDTH,
    height,
    role: 'group',
    'aria-label': label,
    'data-total-us': end,
  }) as SVGSVGElement;
  // The time axis: 0 and the end.
  element('line', { class: 'axis', x1: LABEL, x2: LABEL + PLOT, y1: height - 20, y2: height - 20 }, svg);
  const zero = element('text', { class: 'tick', x: LABEL, y: height - 6 }, svg);
  zero.textContent = '0';
  const last = element('text', { class: 'tick', x: LABEL + PLOT, y: height - 6, 'text-anchor': 'end' }, svg);
  last.textContent = formatUs(end);
  bars.forEach((bar, row) => {
    const y = row * ROW + 4;
    const x = LABEL + bar.startUs * scale;
    const width = Math.max(2, bar.durationUs * scale);
    const group = element(
      'g',
      {
        class: `bar kind-${bar.kind.toLowerCase()}${bar.open ? ' open' : ''}`,
        tabindex: 0,
        role: 'img',
        'aria-label': bar.details.join(', '),
        'data-kind': bar.kind,
        'data-name': bar.name,
        'data-start-us': bar.startUs,
        'data-duration-us': bar.durationUs,
      },
      svg,
    );
    const name = element(
      'text',
      { class: 'bar-label', x: LABEL - 8, y: y + 14, 'text-anchor': 'end' },
      group,
    );
    const kind = bar.kind.toLowerCase();
    name.textContent = (bar.name.startsWith(kind) ? bar.name : `${kind} ${bar.name}`).slice(0, 30);
    element('rect', { x, y, width, height: ROW - 6, rx: 2 }, group);
    const duration = element('text', { class: 'duration', x: x + width + 4, y: y + 14 }, group);
    duration.textContent = bar.open ? `${formatUs(bar.durationUs)}…` : formatUs(bar.durationUs);
    if (bar.firstTokenUs !== undefined) {
      const at = LABEL + bar.firstTokenUs * scale;
      element(
        'line',
        { class: 'first-token', x1: at, x2: at, y1: y - 2, y2: y + ROW - 4, 'data-at-us': bar.firstTokenUs },
        group,
      );
    }
    const show = () => {
      tooltip.textContent = bar.details.join('\n');
      const box = group.getBoundingClientRect();
      tooltip.style.left = `${window.scrollX + box.left + Math.min(x, LABEL + PLOT - 120)}px`;
      tooltip.style.top = `${window.scrollY + box.bottom + 4}px`;
      tooltip.hidden = false;
    };
    const hide = () => {
      tooltip.hidden = true;
    };
    group.addEventListener('mouseenter', show);
    group.addEventListener('focus', show);
    group.addEventListener('mouseleave', hide);
    group.addEventListener('blur', hide);
  });
  into.replaceChildren(svg);
  return svg;
}
