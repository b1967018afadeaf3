// Drive the example page in Debian's Chromium (playwright-core, no browser download): ask one
// question, wait for the turn to end, write a screenshot, print what the page shows as JSON.
//
// node tests/drive.mjs PAGE_URL SCREENSHOT_PATH QUESTION
import { chromium } from 'playwright-core';

const [pageUrl, screenshot, question] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox'],
});
const problems = [];
try {
  const page = await browser.newPage({ viewport: { width: 900, height: 700 } });
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push(message.text());
  });
  page.on('pageerror', (error) => problems.push(String(error)));
  await page.goto(pageUrl);
  await page.fill('#text', question);
  await page.click('#send');
  await page.waitForFunction(() => /^(turn ended|error)/.test(document.getElementById('state').textContent), null, {
    timeout: 90_000,
  });
  await page.screenshot({ path: screenshot, fullPage: true });
  const shown = await page.evaluate(() => ({
    state: document.getElementById('state').textContent,
    deltas: Number(document.getElementById('transcript').dataset.deltas ?? 0),
    replies: [...document.querySelectorAll('.assistant')].map((element) => element.textContent),
    tools: [...document.querySelectorAll('.tool')].map((element) => element.textContent),
  }));
  console.log(JSON.stringify({ ...shown, problems }));
} finally {
  await browser.close();
}
