// Opens a Job's trace page of the API server's dashboard in headless Chromium
// (playwright-core): run by tests/cluster/tests/compose.rs once the Job's traces are in
// Jaeger. Env: PRIMUS_DASHBOARD_URL, PRIMUS_TOKEN, PRIMUS_JOB, PRIMUS_SCREENSHOT,
// PRIMUS_CHROMIUM. Prints what it saw, `ok` last; exits non-zero with the reason when a
// check fails.
"use strict";
const { chromium } = require("playwright-core");

const url = process.env.PRIMUS_DASHBOARD_URL;
const job = process.env.PRIMUS_JOB;
const TIMEOUT = 60_000;

function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function rows(page, group, operation) {
  return page.locator(`.waterfall[data-group="${group}"] .span-row[data-operation="${operation}"]`).count();
}

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.PRIMUS_CHROMIUM,
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  try {
    const page = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
    const errors = [];
    page.on("pageerror", (error) => errors.push(error.message));
    await page.goto(url);
    await page.fill("#token", process.env.PRIMUS_TOKEN);
    await page.click("#sign-in button[type=submit]");
    await page.goto(`${url}#/jobs/${encodeURIComponent(job)}`);

    console.log("step: the Job's time line links its traces");
    await page.click("#traces-link", { timeout: TIMEOUT });
    await page.waitForSelector('.waterfall[data-group="predict"] .span-row[data-operation="serving.predict"]', { timeout: TIMEOUT });
    check(await rows(page, "step", "trainer.step") === 1, "the step's waterfall starts with its trainer.step");
    const pushes = await rows(page, "step", "ps.push_tables");
    check(pushes >= 1, "the step's waterfall shows no ps.push_tables");
    check(await rows(page, "sync", "serving_sync.sparse") === 1, "no serving_sync.sparse cycle");
    const applies = await rows(page, "sync", "/primus.v1.ServingService/ApplyDelta");
    check(applies >= 1, "the cycle shows no ApplyDelta");
    const predicts = await page.locator('.waterfall[data-group="predict"]').count();
    console.log(`step: a step with ${pushes} ps.push_tables, a cycle with ${applies} ApplyDelta, ${predicts} Predicts`);
    check(errors.length === 0, `the page raised errors: ${errors.join("; ")}`);
    await page.screenshot({ path: process.env.PRIMUS_SCREENSHOT, fullPage: true });
    console.log("ok");
  } finally {
    await browser.close();
  }
}

main().catch((error) => {
  console.error(`traces check failed: ${error.message}`);
  process.exit(1);
});
