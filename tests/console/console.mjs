// The console in a real browser: playwright-core driving Debian's chromium
// (headless, no sandbox inside a container, no network but the gateway).
// Called by tests/console/run.sh with the gateway's /ui URL, a token of a
// ServiceAccount allowed in CONSOLE_NS and one allowed nothing. Prints one
// "ok NAME" or "FAIL NAME: why" line per check; exits 1 when any failed.
//
// Every check asserts what the person sees (text on the page, focus, the
// page's own state), never timings. XSS checks look for a flag any of the
// probe skill's payloads would set (window.__xss) and for elements the
// payloads would have created.
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { launch } from "./browser.mjs";

const URL_ = process.env.CONSOLE_URL;
const TOKEN = process.env.CONSOLE_TOKEN;
const DENIED_TOKEN = process.env.CONSOLE_DENIED_TOKEN;
const NS = process.env.CONSOLE_NS;
const NS_DENIED = process.env.CONSOLE_NS_DENIED;
const SHOTS = process.env.CONSOLE_SCREENSHOT_DIR || "";
const TIMEOUT = 120_000;

let failed = 0;
async function check(name, body) {
  try {
    await body();
    console.log(`ok ${name}`);
  } catch (err) {
    failed += 1;
    // What the person saw instead, so a failure in CI explains itself.
    const seen = await page.evaluate(() => `${location.hash} | ${(document.querySelector("main") || document.body).innerText}`).catch((e) => `(page unreadable: ${e})`);
    console.log(`FAIL ${name}: ${String(err && err.message ? err.message : err).split("\n").slice(0, 4).join(" ")} [page: ${seen.replace(/\s+/g, " ").slice(0, 300)}]`);
  }
}
function assert(cond, message) {
  if (!cond) throw new Error(message);
}

async function shot(page, name) {
  if (!SHOTS) return;
  mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: false });
}

async function noXss(page, where) {
  const flag = await page.evaluate(() => window.__xss);
  assert(flag === undefined, `a payload ran on ${where}: window.__xss = ${flag}`);
  const injected = await page.evaluate(() => document.querySelectorAll("main img, main script, main b, main a[href^='javascript']").length);
  assert(injected === 0, `${injected} element(s) made from data on ${where}`);
}

const browser = await launch(chromium, { timeout: TIMEOUT });
const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
context.setDefaultTimeout(TIMEOUT);
const page = await context.newPage();
const cspViolations = [];
page.on("console", (m) => { if (/Content Security Policy/i.test(m.text())) cspViolations.push(m.text()); });
const requests = [];
page.on("request", (r) => requests.push(r.url()));

try {
  await check("the page is served with the strict policy and nosniff", async () => {
    const response = await page.goto(URL_);
    const csp = response.headers()["content-security-policy"] || "";
    assert(csp.includes("default-src 'none'") && csp.includes("script-src 'self'") && !csp.includes("unsafe-inline"), `CSP: ${csp}`);
    assert(response.headers()["x-content-type-options"] === "nosniff", "no nosniff");
    await page.getByLabel("Kubernetes bearer token").waitFor();
    await shot(page, "login");
  });

  await check("a bad token is refused with the API server's reason, on the sign-in page", async () => {
    await page.getByLabel("Kubernetes bearer token").fill("not-a-token");
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("alert").filter({ hasText: "not accepted" }).waitFor();
    assert(await page.evaluate(() => sessionStorage.length) === 0, "a refused token was kept");
  });

  await check("sign in with a token by keyboard alone", async () => {
    const field = page.getByLabel("Kubernetes bearer token");
    await field.focus();
    await page.keyboard.insertText(TOKEN);
    await page.keyboard.press("Tab"); // past the hint to the button
    const focused = await page.evaluate(() => document.activeElement && document.activeElement.textContent);
    assert(focused === "Sign in", `Tab from the token field reached ${JSON.stringify(focused)}`);
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "Your namespaces" }).waitFor();
    const who = await page.locator("#who").textContent();
    assert(who.includes("system:serviceaccount:") && who.includes(":skills-agent"), `who: ${who}`);
    assert(!page.url().includes(TOKEN.slice(0, 20)), "the token is in the URL");
  });

  await check("only the caller's namespaces are listed", async () => {
    const names = await page.locator("#namespaces a").allTextContents();
    assert(names.includes(NS), `${NS} missing from ${JSON.stringify(names)}`);
    assert(!names.includes(NS_DENIED), `${NS_DENIED} (bound, no rights) is listed: ${JSON.stringify(names)}`);
    await shot(page, "namespaces");
  });

  await check("keyboard: Tab reaches the namespace link, Enter opens it and focus lands on its heading", async () => {
    let reached = false;
    for (let i = 0; i < 15 && !reached; i++) {
      await page.keyboard.press("Tab");
      reached = await page.evaluate((ns) => document.activeElement && document.activeElement.textContent === ns && document.activeElement.tagName === "A", NS);
    }
    assert(reached, "never reached the namespace link by Tab");
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: `Namespace ${NS}` }).waitFor();
    const focused = await page.evaluate(() => document.activeElement && document.activeElement.tagName);
    assert(focused === "H1", `focus is on ${focused}`);
  });

  await check("the namespace shows its skills, and markup in a description is text", async () => {
    await page.locator("#skills").getByText("console-xss").waitFor();
    await page.locator("#skills").getByText("word-count").waitFor();
    const row = await page.locator("#skills tr", { hasText: "console-xss" }).textContent();
    assert(row.includes('<img src=x onerror="window.__xss=1">') && row.includes("<script>window.__xss=2</script>"), `row: ${row}`);
    await page.locator("#live", { hasText: "live" }).waitFor();
    await noXss(page, "the namespace page");
    await shot(page, "namespace");
  });

  const payload = '<img src=x onerror="window.__xss=8"><script>window.__xss=9</script>';
  let jobUrl = "";
  await check("a run is previewed first and starts only when confirmed", async () => {
    await page.locator("#skills a", { hasText: "console-xss" }).click();
    await page.getByRole("heading", { name: "Skill console-xss" }).waitFor();
    const instructions = await page.locator("#instructions").textContent();
    assert(instructions.includes("<script>window.__xss=3</script>"), "the instructions are not shown as text");
    await noXss(page, "the skill page");
    await page.getByLabel("Script").selectOption("scripts/echo.sh");
    await page.getByLabel("Arguments").fill(`hello from the console\n${payload}`);
    await page.getByRole("button", { name: "Preview run" }).click();
    await page.locator("#run-preview").waitFor();
    const preview = await page.locator("#run-preview").textContent();
    assert(preview.includes("Nothing has run yet") && preview.includes("Network") && preview.includes("pod"), `preview: ${preview}`);
    // The command is shown as a JSON array: the argument, quoted.
    assert(preview.includes(JSON.stringify(payload).slice(1, -1)), `the preview does not show the argument as given: ${preview}`);
    const focused = await page.evaluate(() => document.activeElement && document.activeElement.id);
    assert(focused === "run-confirm", `focus after the preview is on ${focused}`);
    await noXss(page, "the preview");
    await shot(page, "run-preview");
    await page.keyboard.press("Enter");
    await page.waitForURL(/#\/ns\/.*\/job\/skj-/);
    jobUrl = page.url();
  });

  await check("the run's output appears on its page (live), as text", async () => {
    assert(jobUrl, "no job was started");
    await page.locator(".state", { hasText: "succeeded" }).waitFor({ timeout: 240_000 });
    const stdout = await page.locator("#stdout").textContent();
    assert(stdout.includes("hello from the console"), `stdout: ${stdout}`);
    assert(stdout.includes(payload) && stdout.includes('<img src=x onerror="window.__xss=6">'), `stdout lacks the payloads as text: ${stdout}`);
    const stderr = await page.locator("#stderr").textContent();
    assert(stderr.includes("<b>stderr is text too</b>"), `stderr: ${stderr}`);
    await noXss(page, "the job page");
    await shot(page, "job");
  });

  await check("the job is in the namespace's job list", async () => {
    const id = decodeURIComponent(jobUrl.split("/job/")[1] || "");
    await page.locator("#crumbs a", { hasText: NS }).click();
    await page.locator(`#jobs tr[data-job="${id}"]`).waitFor();
    const row = await page.locator(`#jobs tr[data-job="${id}"]`).textContent();
    assert(row.includes("console-xss") && row.includes("succeeded"), `row: ${row}`);
    await noXss(page, "the job list");
  });

  await check("a namespace without rights is a 403 page naming the missing permission", async () => {
    await page.goto(`${URL_}#/ns/${NS_DENIED}`);
    await page.getByRole("heading", { name: "Access denied" }).waitFor();
    const alert = await page.getByRole("alert").textContent();
    assert(alert.includes(`may not get skillbindings.skill-operator.dev in namespace ${NS_DENIED}`) && alert.includes("HTTP 403"), `alert: ${alert}`);
    await shot(page, "denied");
  });

  await check("signing out shows the sign-in form once, so a token typed at once is kept", async () => {
    // Counts the sign-in forms put on the page from the click until the
    // hash change's own handlers have run (the app's listener is first).
    const forms = await page.evaluate(() => new Promise((resolve, reject) => {
      // Without a hash change there is no event to wait for.
      if (location.hash === "#/login") return reject(new Error("already on #/login before signing out"));
      let added = 0;
      const observer = new MutationObserver((records) => {
        for (const r of records) for (const n of r.addedNodes) {
          if (n.nodeType === 1 && (n.id === "login" || n.querySelector("#login"))) added += 1;
        }
      });
      observer.observe(document.body, { childList: true, subtree: true });
      window.addEventListener("hashchange", () => setTimeout(() => { observer.disconnect(); resolve(added); }, 0), { once: true });
      document.getElementById("signout").click();
    }));
    assert(forms === 1, `the sign-in form was put on the page ${forms} times: a token typed into the first is lost`);
  });

  await check("a token with no rights sees no namespace", async () => {
    await page.getByLabel("Kubernetes bearer token").fill(DENIED_TOKEN);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.locator("#namespaces-empty").waitFor();
    await page.goto(`${URL_}#/ns/${NS}`);
    await page.getByRole("heading", { name: "Access denied" }).waitFor();
  });

  await check("nothing was loaded from another origin and the policy was never violated", async () => {
    const origin = new URL(URL_).origin;
    const foreign = requests.filter((u) => !u.startsWith(origin) && !u.startsWith("data:") && !u.startsWith("blob:"));
    assert(foreign.length === 0, `requests elsewhere: ${foreign.slice(0, 3).join(", ")}`);
    assert(cspViolations.length === 0, `CSP reports: ${cspViolations.slice(0, 2).join(" | ")}`);
  });
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
