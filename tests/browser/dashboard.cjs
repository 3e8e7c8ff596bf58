// Drives the API server's dashboard in headless Chromium (playwright-core): run by
// tests/dashboard.rs, which starts the cluster and the Job and reads this script's lines.
// Env: PRIMUS_DASHBOARD_URL, PRIMUS_TOKEN, PRIMUS_JOB, PRIMUS_SCREENSHOT, PRIMUS_CHROMIUM.
// Prints `step: ...` as it goes, `delete <job>` when the test should delete the Job, and
// exits non-zero with the reason when a check fails.
"use strict";
const { chromium } = require("playwright-core");

const url = process.env.PRIMUS_DASHBOARD_URL;
const token = process.env.PRIMUS_TOKEN;
const job = process.env.PRIMUS_JOB;
const TIMEOUT = 60_000;

function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function signIn(page, secret) {
  await page.goto(url);
  await page.fill("#token", secret);
  await page.click("#sign-in button[type=submit]");
}

/// The number of points the chart of `series` shows (0 when it is not drawn).
async function points(page, series) {
  const chart = page.locator(`.chart[data-series="${series}"]`);
  if ((await chart.count()) === 0) return 0;
  return Number((await chart.getAttribute("data-points")) || 0);
}

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.PRIMUS_CHROMIUM,
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    const errors = [];
    page.on("pageerror", (error) => {
      console.log(`pageerror: ${error.message}`);
      errors.push(error.message);
    });

    console.log("step: a wrong token sees nothing");
    await signIn(page, "not-the-token");
    await page.waitForSelector("#sign-in-error:has-text('refused')", { timeout: TIMEOUT });
    check((await page.locator("#jobs").count()) === 0, "the Jobs table shows without a token");
    check(!(await page.content()).includes(job), "the Job's name shows without a token");

    console.log("step: the right token lists the Job");
    await signIn(page, token);
    await page.waitForSelector(`tr[data-job="${job}"]`, { timeout: TIMEOUT });

    console.log("step: the Job's curves grow live, its executors' CPU among them");
    await page.click(`tr[data-job="${job}"] a`);
    const series = "samples_per_second/trainer";
    await page.waitForFunction((s) => Number(document.querySelector(`.chart[data-series="${s}"]`)?.dataset.points || 0) >= 2,
      series, { timeout: TIMEOUT });
    const before = await points(page, series);
    await page.waitForFunction(([s, n]) => Number(document.querySelector(`.chart[data-series="${s}"]`)?.dataset.points || 0) > n,
      [series, before], { timeout: TIMEOUT });
    const after = await points(page, series);
    await page.waitForSelector('.chart[data-series="cpu_cores/trainer/trainer-0"]', { timeout: TIMEOUT });
    const executors = await page.locator("tr[data-executor]").count();
    check(executors >= 4, `the topology lists ${executors} executors, not the Job's 4`);
    const marks = await page.locator("#events svg.strip rect").count();
    check(marks > 0 && marks === (await page.locator("#events li").count()), `the time line shows ${marks} marks`);
    console.log(`step: ${series} went from ${before} to ${after} points without a reload`);
    await page.screenshot({ path: process.env.PRIMUS_SCREENSHOT, fullPage: false });

    console.log("step: the curves keep their history across a reload");
    await page.reload();
    await page.waitForFunction(([s, n]) => Number(document.querySelector(`.chart[data-series="${s}"]`)?.dataset.points || 0) >= n,
      [series, after], { timeout: TIMEOUT });

    console.log("step: the Dataset's page shows the Job's data tasks");
    await page.goto(`${url}#/datasets/criteo`);
    await page.waitForSelector(`td:has-text("${job}")`, { timeout: TIMEOUT });
    await page.waitForSelector('td:has-text(" tasks (")', { timeout: TIMEOUT });

    console.log("step: a deleted Job leaves the list");
    await page.goto(`${url}#/jobs`);
    await page.waitForSelector(`tr[data-job="${job}"]`, { timeout: TIMEOUT });
    console.log(`delete ${job}`);
    await page.waitForSelector(`tr[data-job="${job}"]`, { state: "detached", timeout: TIMEOUT });
    check(errors.length === 0, `the page raised errors: ${errors.join("; ")}`);
    console.log("ok");
  } finally {
    await browser.close();
  }
}

main().catch((error) => {
  console.error(`dashboard check failed: ${error.message}`);
  process.exit(1);
});
