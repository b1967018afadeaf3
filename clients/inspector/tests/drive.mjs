// Drive the inspector page in Debian's Chromium (playwright-core, no browser download) and print
// what it shows as one JSON line; screenshots go to OUT_DIR. Run by tests/e2e/test_inspector_e2e.py.
//
// node drive.mjs MODE BASE_URL TOKEN CONVERSATION OUT_DIR [TOOL_CALL_ID | OTHER_CONVERSATION]
//   inspect: the conversation's turns (bars as drawn), a tool call's output once expanded, a
//            bar's hover details, the failed-only filter, axe-core's violations
//   live:    prints `ready` once the page shows the conversation; then the running turn the test
//            starts, its live chart sampled until it ended and was redrawn from the store
//   tenant:  what another tenant's token lists and opens
//   hash:    what the page shows once open on CONVERSATION, after the open tab's fragment
//            changed to OTHER_CONVERSATION (`location.hash`, as a link does), and after Back
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';

const [mode, base, token, conversation, outDir, extra] = process.argv.slice(2);
const toolCallId = extra;
const require = createRequire(import.meta.url);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox'],
});
const problems = [];
const result = { problems };

const barsOf = (page) =>
  page.$$eval('section.turn', (sections) =>
    sections.map((section) => ({
      requestId: section.dataset.requestId,
      status: section.dataset.status,
      live: section.dataset.live === 'true',
      error: section.querySelector('.turn-error')?.textContent ?? '',
      bars: [...section.querySelectorAll('g.bar')].map((bar) => {
        const rect = bar.querySelector('rect');
        const first = bar.querySelector('line.first-token');
        return {
          kind: bar.dataset.kind,
          name: bar.dataset.name,
          startUs: Number(bar.dataset.startUs),
          durationUs: Number(bar.dataset.durationUs),
          x: Number(rect.getAttribute('x')),
          width: Number(rect.getAttribute('width')),
          firstTokenX: first ? Number(first.getAttribute('x1')) : null,
          label: bar.getAttribute('aria-label'),
        };
      }),
    })),
  );

try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push(message.text());
  });
  page.on('pageerror', (error) => problems.push(String(error)));
  await page.goto(
    `${base}/inspector/#token=${encodeURIComponent(token)}&conversation=${encodeURIComponent(conversation)}`,
  );
  result.address = page.url();
  if (mode === 'inspect') {
    await page.waitForSelector('section.turn g.bar', { timeout: 60_000 });
    result.conversations = await page.$$eval('button.conversation', (buttons) =>
      buttons.map((b) => b.dataset.id),
    );
    result.turns = await barsOf(page);
    await page.screenshot({ path: `${outDir}/inspector-conversation.png`, fullPage: true });
    // Expand the tool call and read its output as shown.
    const tool = page.locator(`details.part-tool[data-tool-call-id="${toolCallId}"]`);
    await tool.locator('summary').click();
    await tool.locator('pre.tool-output').waitFor({ state: 'visible' });
    result.toolOutput = await tool.locator('pre.tool-output').textContent();
    result.toolInput = await tool.locator('pre.tool-input').textContent();
    result.badges = await page.$$eval('.badge', (badges) => badges.map((b) => b.textContent));
    await tool.screenshot({ path: `${outDir}/inspector-tool-call.png` });
    // Hover a tool bar: its details show.
    const bar = page.locator('section.turn g.bar[data-kind="TOOL"]').first();
    await bar.locator('rect').hover();
    await page.locator('#tooltip').waitFor({ state: 'visible' });
    result.tooltip = await page.locator('#tooltip').textContent();
    await page
      .locator('section.turn[data-status="completed"] .chart')
      .first()
      .screenshot({ path: `${outDir}/inspector-gantt.png` });
    // The keyboard reaches the bars too.
    await page.locator('section.turn g.bar').first().focus();
    result.focusedTooltip = await page.locator('#tooltip').textContent();
    // Failed turns only.
    await page.getByLabel('Failed turns only').check();
    await page.waitForFunction(() =>
      [...document.querySelectorAll('section.turn')].every((s) => s.dataset.status !== 'completed'),
    );
    result.failedTurns = await barsOf(page);
    await page.screenshot({ path: `${outDir}/inspector-failed-turns.png`, fullPage: true });
    await page.getByLabel('Failed turns only').uncheck();
    await page.waitForSelector('section.turn[data-status="completed"]');
    // Accessibility: axe-core from node_modules, evaluated through the DevTools protocol (the
    // page's Content-Security-Policy refuses injected script tags, as it should).
    await page.evaluate(readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8'));
    result.axe = await page.evaluate(async () => {
      const found = await window.axe.run(document, { resultTypes: ['violations'] });
      return found.violations.map((v) => ({
        id: v.id,
        impact: v.impact,
        nodes: v.nodes.length,
        help: v.help,
      }));
    });
  } else if (mode === 'live') {
    // The page is open on the conversation; the test starts the turn once it reads `ready`.
    await page.waitForSelector('section.turn', { timeout: 60_000 });
    console.log('ready');
    await page.waitForSelector('section.turn[data-live="true"] g.bar', { timeout: 60_000 });
    const samples = [];
    let shot = false;
    for (;;) {
      const turns = await barsOf(page);
      const live = turns.find((turn) => turn.live);
      if (!live) break;
      const last = samples.at(-1);
      const counts = {
        bars: live.bars.length,
        kinds: live.bars.map((bar) => bar.kind),
        totalUs: Math.max(0, ...live.bars.map((b) => b.startUs + b.durationUs)),
      };
      if (!last || last.bars !== counts.bars || last.totalUs !== counts.totalUs) samples.push(counts);
      if (!shot && live.bars.length >= 3) {
        await page
          .locator('section.turn[data-live="true"]')
          .screenshot({ path: `${outDir}/inspector-live.png` });
        shot = true;
      }
      await page.waitForTimeout(100);
    }
    result.samples = samples;
    await page.waitForSelector('section.turn[data-status="completed"] g.bar', { timeout: 60_000 });
    result.after = await barsOf(page);
  } else if (mode === 'hash') {
    // What the page shows once it has opened `id` (its title, then its last status line).
    const shown = async (id) => {
      await page.waitForFunction(
        (id) =>
          document.getElementById('conversation-title').textContent === id &&
          / message\(s\)$/.test(document.getElementById('status').textContent),
        id,
        { timeout: 60_000 },
      );
      return {
        address: new URL(page.url()).hash,
        title: await page.locator('#conversation-title').textContent(),
        current: await page.$$eval('button.conversation[aria-current="true"]', (buttons) =>
          buttons.map((b) => b.dataset.id),
        ),
        messages: await page.$$eval('.message', (items) => items.map((item) => item.dataset.id)),
        turns: await page.$$eval('section.turn', (items) => items.map((item) => item.dataset.requestId)),
      };
    };
    result.first = await shown(conversation);
    await page.evaluate((id) => {
      location.hash = `conversation=${encodeURIComponent(id)}`;
    }, extra);
    result.changed = await shown(extra);
    await page.goBack();
    result.back = await shown(conversation);
  } else if (mode === 'tenant') {
    await page.waitForFunction(() => document.getElementById('status').textContent !== '', null, {
      timeout: 30_000,
    });
    await page.waitForFunction(
      () => !document.getElementById('status').textContent.startsWith('loading'),
      null,
      { timeout: 30_000 },
    );
    result.status = await page.locator('#status').textContent();
    result.conversations = await page.$$eval('button.conversation', (buttons) =>
      buttons.map((b) => b.dataset.id),
    );
    result.messages = await page.$$eval('.message', (items) => items.length);
    result.turns = await page.$$eval('section.turn', (items) => items.length);
    await page.screenshot({ path: `${outDir}/inspector-other-tenant.png`, fullPage: true });
  }
  console.log(JSON.stringify(result));
} finally {
  await browser.close();
}
