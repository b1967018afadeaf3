// Drive the AI SDK example page in Debian's Chromium (playwright-core, no browser download): ask
// one question, wait for the client tool's button, switch the page's model field to FOLLOW_UP_MODEL
// (the model of the continuation), share the location, wait for a reply holding EXPECT, write a
// screenshot, print what the page shows as JSON.
//
// node tests/drive.mjs PAGE_URL SCREENSHOT_PATH QUESTION FOLLOW_UP_MODEL EXPECT
import { chromium } from 'playwright-core';

const [pageUrl, screenshot, question, followUpModel, expect] = process.argv.slice(2);
const timeout = 60_000;
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox'],
});
const problems = [];
let page;
try {
  page = await browser.newPage({ viewport: { width: 900, height: 800 } });
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push(message.text());
  });
  page.on('pageerror', (error) => problems.push(String(error)));
  await page.goto(pageUrl);
  await page.fill('#text', question);
  await page.click('#send');
  // The first turn ends waiting for the client tool: the page offers to share the location.
  await page.waitForFunction(
    () => document.getElementById('state').textContent === 'ready' && document.getElementById('share-location'),
    null,
    { timeout },
  );
  const asked = await page.evaluate(() => ({
    state: document.getElementById('state').textContent,
    tools: [...document.querySelectorAll('.tool')].map((element) => element.dataset.state),
  }));
  await page.fill('#model', followUpModel);
  await page.click('#share-location');
  await page.waitForFunction(
    (expected) =>
      document.getElementById('state').textContent === 'ready' &&
      [...document.querySelectorAll('.assistant .text')].some((element) => element.textContent.includes(expected)),
    expect,
    { timeout },
  );
  await page.screenshot({ path: screenshot, fullPage: true });
  const shown = await page.evaluate(() => ({
    state: document.getElementById('state').textContent,
    error: document.getElementById('error')?.textContent ?? null,
    textUpdates: Number(document.getElementById('transcript').dataset.textUpdates ?? 0),
    messages: [...document.querySelectorAll('#transcript > div')].map((element) => ({
      role: element.dataset.role,
      texts: [...element.querySelectorAll('.text')].map((text) => text.textContent),
      tools: [...element.querySelectorAll('.tool')].map((tool) => ({
        name: tool.dataset.tool,
        state: tool.dataset.state,
        shown: tool.textContent,
      })),
    })),
  }));
  console.log(JSON.stringify({ ...shown, asked, problems }));
} catch (error) {
  // What the page showed when a wait timed out, for the test's failure message.
  if (page) process.stderr.write(`the page: ${await page.evaluate(() => document.body.innerText)}\n`);
  process.stderr.write(`problems: ${JSON.stringify(problems)}\n`);
  throw error;
} finally {
  await browser.close();
}
