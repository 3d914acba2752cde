// The console's figures (called by bench.sh): first paint of a namespace
// with 100 bound skills and 100 SkillJobs, and the gateway's memory with
// the console open in 50 pages. Prints figures; asserts nothing about time.
//
// First paint: a fresh browser context per sample (no cache, a new
// sessionStorage holding the token), navigated to the namespace's page;
// the sample is the page's own clock (performance.now(), from navigation
// start) in the first animation frame in which both tables hold every row, plus Chromium's
// first-contentful-paint entry. Memory: VmRSS of the gateway's process
// (this machine is the node) before any page, with 50 browser contexts
// each showing the namespace and holding its event stream, and
// after they closed.
import { chromium } from "playwright-core";
import { readFileSync } from "node:fs";
import { launch } from "./browser.mjs";

const URL_ = process.env.CONSOLE_URL;
const TOKEN = process.env.CONSOLE_BENCH_TOKEN;
const NS = process.env.CONSOLE_NS_BENCH;
const PID = process.env.CONSOLE_GATEWAY_PID || "";
const SAMPLES = Number(process.env.CONSOLE_BENCH_SAMPLES || 15);
const PAGES = Number(process.env.CONSOLE_BENCH_PAGES || 50);
const SKILLS = Number(process.env.CONSOLE_BENCH_SKILLS || 100);
const JOBS = Number(process.env.CONSOLE_BENCH_JOBS || 100);

function rssKiB() {
  if (!PID) return null;
  const line = readFileSync(`/proc/${PID}/status`, "utf8").split("\n").find((l) => l.startsWith("VmRSS:"));
  return line ? Number(line.split(/\s+/)[1]) : null;
}
function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}
function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
}

async function openNamespace(context) {
  const page = await context.newPage();
  await page.goto(`${URL_}#/ns/${NS}`);
  // The predicate runs in the page on every animation frame and returns the
  // page's own clock the first time both tables are full: the sample is
  // that moment, not the later one at which Playwright hears of it.
  const filled = await page.waitForFunction(([skills, jobs]) =>
    document.querySelectorAll("#skills tbody tr").length >= skills && document.querySelectorAll("#jobs-body tr").length >= jobs && performance.now(),
  [SKILLS, JOBS], { timeout: 60_000, polling: "raf" });
  const loaded = await filled.jsonValue();
  const fcp = await page.evaluate(() => (performance.getEntriesByName("first-contentful-paint")[0] || {}).startTime || null);
  return { page, loaded, fcp };
}

const browser = await launch(chromium);
const withToken = async () => {
  const context = await browser.newContext();
  await context.addInitScript((t) => window.sessionStorage.setItem("skill-operator.console.token", t), TOKEN);
  return context;
};
try {
  // One warm-up (the gateway builds the namespace and fills its caches once).
  {
    const context = await withToken();
    await openNamespace(context);
    await context.close();
  }
  const loaded = [], fcp = [];
  for (let i = 0; i < SAMPLES; i++) {
    const context = await withToken();
    const sample = await openNamespace(context);
    loaded.push(sample.loaded);
    if (sample.fcp !== null) fcp.push(sample.fcp);
    await context.close();
  }
  console.log(`console bench: ${SKILLS} skills, ${JOBS} SkillJobs, ${SAMPLES} samples`);
  console.log(`console bench: both tables filled: median ${median(loaded).toFixed(0)} ms, p90 ${pct(loaded, 90).toFixed(0)} ms (goal: <= 300 ms)`);
  if (fcp.length) console.log(`console bench: first-contentful-paint: median ${median(fcp).toFixed(0)} ms, p90 ${pct(fcp, 90).toFixed(0)} ms`);

  if (PID) {
    const before = rssKiB();
    // One browser context per open console: a browser allows six connections
    // per host, so the event streams of more pages in one context would
    // leave the seventh page no connection to load with.
    const contexts = [];
    for (let i = 0; i < PAGES; i++) {
      const context = await withToken();
      const { page } = await openNamespace(context);
      await page.locator("#live", { hasText: "live" }).waitFor({ timeout: 60_000 });
      contexts.push(context);
    }
    const open = rssKiB();
    for (const context of contexts) await context.close();
    const after = rssKiB();
    const mib = (k) => (k / 1024).toFixed(1);
    console.log(`console bench: gateway RSS ${mib(before)} MiB before, ${mib(open)} MiB with ${PAGES} pages open (+${mib(open - before)} MiB; goal: <= +20 MiB), ${mib(after)} MiB after they closed`);
  } else {
    console.log("console bench: gateway memory not measured (its process is not on this machine)");
  }
} finally {
  await browser.close();
}
