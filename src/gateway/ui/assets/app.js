// skill-operator console. Plain JavaScript, no dependencies, no build.
//
// Safety rules this file keeps (the page's CSP forbids inline script, so
// markup injected anywhere would not run, but nothing is ever injected):
// - every piece of data reaches the page as a text node or an attribute
//   value set through the DOM (el(), text()); there is no innerHTML,
//   outerHTML, insertAdjacentHTML or document.write in this file;
// - the token is kept in sessionStorage (this tab only) and sent only as
//   `Authorization: Bearer` to this origin; never in a URL.
"use strict";

const TOKEN_KEY = "skill-operator.console.token";
const API = "api";

// ---------------------------------------------------------------- DOM

/** An element with attributes and children (strings become text nodes). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value === true) node.setAttribute(name, "");
    else node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
  }
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

function main() {
  return document.getElementById("main");
}

function announce(message) {
  const region = document.getElementById("announce");
  region.textContent = "";
  // A change the screen reader hears even when the text repeats.
  window.setTimeout(() => { region.textContent = message; }, 50);
}

/** Replace the page body; focus its heading so keyboard and reader users land there. */
function show(title, ...content) {
  const heading = el("h1", { tabindex: "-1" }, title);
  clear(main()).append(heading, ...content);
  document.title = `${title} · skill-operator console`;
  heading.focus();
}

function crumbs(parts) {
  const list = clear(document.getElementById("crumbs"));
  parts.forEach(([label, href], i) => {
    const last = i === parts.length - 1;
    list.append(el("li", {}, last ? el("span", { "aria-current": "page" }, label) : el("a", { href }, label)));
  });
}

function when(ms) {
  if (!ms) return "—";
  return new Date(ms).toLocaleString();
}

function seconds(ms) {
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

/** The script's own run time when the launcher reported it, else start to finish. */
function duration(run) {
  if (!run) return "—";
  if (run.durationMs) return seconds(run.durationMs);
  if (run.finishedAtMs && run.startedAtMs) return seconds(run.finishedAtMs - run.startedAtMs);
  return "—";
}

function stateBadge(state) {
  return el("span", { class: `state state-${state}` }, state);
}

// ---------------------------------------------------------------- API

function token() {
  return window.sessionStorage.getItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(status, code, message, body) {
    super(message);
    this.status = status;
    this.code = code;
    this.body = body;
  }
}

async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const t = token();
  if (t) headers.set("Authorization", `Bearer ${t}`);
  if (options.json !== undefined) headers.set("Content-Type", "application/json");
  const response = await fetch(`${API}/${path}`, {
    method: options.method || "GET",
    headers,
    body: options.json !== undefined ? JSON.stringify(options.json) : undefined,
    signal: options.signal,
    cache: "no-store",
    credentials: "omit",
  });
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  if (!response.ok) {
    const err = (body && body.error) || {};
    throw new ApiError(response.status, err.code || `http-${response.status}`, err.message || response.statusText, body);
  }
  return body;
}

function ns(namespace) {
  return `ns/${encodeURIComponent(namespace)}`;
}

/** A refusal as the page shows it; a refused token goes back to sign-in. */
function failure(err, what) {
  if (err instanceof ApiError && err.status === 401) {
    window.sessionStorage.removeItem(TOKEN_KEY);
    return login(`Your token was not accepted: ${err.message}`);
  }
  const title = err instanceof ApiError && err.status === 403 ? "Access denied" : `Could not load ${what}`;
  const code = err instanceof ApiError ? ` (HTTP ${err.status}, ${err.code})` : "";
  show(title, el("p", { class: "alert", role: "alert" }, `${err.message}${code}`), el("p", {}, el("a", { href: "#/" }, "Back to your namespaces")));
}

// ---------------------------------------------------------------- live updates

let live = null;
// What the current view follows, to resume when its tab is shown again.
let following = null;

function stopLive() {
  if (live) live.abort();
  live = null;
  following = null;
}

// A hidden tab gives its stream up: a browser allows six connections per
// host, and every open console tab would otherwise hold one. Shown again,
// it reconnects; the stream's first events are every current job.
document.addEventListener("visibilitychange", () => {
  if (document.hidden && live) {
    const resume = following;
    live.abort();
    live = null;
    following = resume;
  } else if (!document.hidden && following && !live) {
    follow(...following);
  }
});

/**
 * Follow a namespace's events: fetch (so the token travels in a header),
 * read the text/event-stream body, call onEvent(name, data). The server
 * ends each stream when the token's review expires; reconnect then.
 */
function follow(namespace, onEvent, onState) {
  stopLive();
  const controller = new AbortController();
  live = controller;
  following = [namespace, onEvent, onState];
  let failures = 0;
  const connect = async () => {
    while (!controller.signal.aborted) {
      try {
        const response = await fetch(`${API}/${ns(namespace)}/events`, {
          headers: { Authorization: `Bearer ${token()}`, Accept: "text/event-stream" },
          signal: controller.signal,
          cache: "no-store",
          credentials: "omit",
        });
        if (response.status === 401 || response.status === 403) {
          onState(`live updates stopped: HTTP ${response.status}`);
          return;
        }
        if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
        failures = 0;
        onState("live");
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            let name = "message";
            const data = [];
            for (const line of block.split("\n")) {
              if (line.startsWith("event: ")) name = line.slice(7);
              else if (line.startsWith("data: ")) data.push(line.slice(6));
            }
            if (data.length) {
              let parsed = null;
              try { parsed = JSON.parse(data.join("\n")); } catch (_) { parsed = null; }
              onEvent(name, parsed);
            }
          }
        }
      } catch (err) {
        if (controller.signal.aborted) return;
        failures += 1;
        onState("reconnecting…");
        // Back off on repeated failures (a stream ended by `reauth` reconnects at once).
        await new Promise((resolve) => window.setTimeout(resolve, Math.min(30000, 500 * 2 ** failures)));
      }
    }
  };
  connect();
}

// ---------------------------------------------------------------- views

function login(message) {
  stopLive();
  crumbs([["Sign in", "#/login"]]);
  document.getElementById("who").textContent = "";
  document.getElementById("signout").hidden = true;
  const field = el("textarea", { id: "token", name: "token", required: true, autocomplete: "off", spellcheck: "false", "aria-describedby": "token-hint" });
  const issuers = el("div", { id: "issuers" });
  const form = el("form", { id: "login", onsubmit: async (event) => {
    event.preventDefault();
    const value = field.value.trim();
    if (!value) return;
    window.sessionStorage.setItem(TOKEN_KEY, value);
    try {
      await whoami();
      go("#/");
    } catch (err) {
      window.sessionStorage.removeItem(TOKEN_KEY);
      const text = err instanceof ApiError ? err.message : String(err);
      login(`Your token was not accepted: ${text}`);
    }
  } },
    el("label", { for: "token" }, "Kubernetes bearer token"),
    field,
    el("p", { id: "token-hint", class: "hint" }, "For example the output of: kubectl create token <serviceaccount> -n <namespace>. It stays in this browser tab (sessionStorage) and is sent only to this gateway."),
    issuers,
    el("div", { class: "row" }, el("button", { type: "submit", class: "primary" }, "Sign in")));
  show("Sign in", message ? el("p", { class: "alert", role: "alert" }, message) : "", form);
  api("config").then((config) => {
    const servers = (config && config.authorizationServers) || [];
    if (servers.length) {
      issuers.append(el("p", { class: "hint" }, "Tokens are also issued by:"), el("ul", {}, servers.map((s) => el("li", {}, el("a", { href: s, rel: "noopener noreferrer" }, s)))));
    }
  }).catch(() => {});
  field.focus();
}

async function whoami() {
  const me = await api("me");
  document.getElementById("who").textContent = `signed in as ${me.user}`;
  document.getElementById("signout").hidden = false;
  return me;
}

async function namespacesView() {
  stopLive();
  crumbs([["Namespaces", "#/"]]);
  const list = await api("namespaces");
  const items = list.namespaces.map((n) => el("li", {}, el("a", { href: `#/ns/${encodeURIComponent(n)}` }, n)));
  show("Your namespaces",
    items.length ? el("ul", { class: "plain", id: "namespaces" }, items)
      : el("p", { id: "namespaces-empty" }, "No namespace with bound skills lets you read its skills (get skillbindings)."),
    list.truncated ? el("p", { class: "hint" }, `Only the first ${list.listedMax} namespaces with bindings were checked.`) : "");
}

function jobRow(namespace, job) {
  const link = el("a", { href: `#/ns/${encodeURIComponent(namespace)}/job/${encodeURIComponent(job.id)}` }, job.id);
  return el("tr", { "data-job": job.id },
    el("td", {}, link),
    el("td", {}, job.skill),
    el("td", {}, job.run ? job.run.script : "—"),
    el("td", {}, stateBadge(job.state)),
    el("td", {}, when(job.createdAtMs)),
    el("td", {}, duration(job.run)));
}

function jobsTable(namespace, jobs) {
  const body = el("tbody", { id: "jobs-body" }, jobs.map((j) => jobRow(namespace, j)));
  return el("table", { id: "jobs" },
    el("caption", { class: "visually-hidden" }, "Your jobs in this namespace, newest first"),
    el("thead", {}, el("tr", {}, ["Job", "Skill", "Script", "State", "Created", "Duration"].map((h) => el("th", { scope: "col" }, h)))),
    body);
}

async function namespaceView(namespace) {
  crumbs([["Namespaces", "#/"], [namespace, `#/ns/${encodeURIComponent(namespace)}`]]);
  const [skills, jobs] = await Promise.all([api(`${ns(namespace)}/skills`), api(`${ns(namespace)}/jobs`)]);
  const skillRows = skills.skills.map((s) => el("tr", {},
    el("td", {}, el("a", { href: `#/ns/${encodeURIComponent(namespace)}/skill/${encodeURIComponent(s.name)}` }, s.name)),
    el("td", {}, s.description),
    el("td", {}, s.scripts.runnable.join(", ") || "—")));
  const state = el("span", { class: "live", id: "live" }, "connecting…");
  const table = jobsTable(namespace, jobs.jobs);
  show(`Namespace ${namespace}`,
    el("h2", {}, `Skills (${skills.skills.length})`),
    el("table", { id: "skills" },
      el("caption", { class: "visually-hidden" }, "Skills bound in this namespace"),
      el("thead", {}, el("tr", {}, ["Skill", "Description", "Runnable scripts"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, skillRows)),
    el("h2", {}, "Your jobs ", state),
    table);
  const body = document.getElementById("jobs-body");
  follow(namespace, (name, data) => {
    if (name === "job" && data) {
      const row = jobRow(namespace, data);
      const old = body.querySelector(`tr[data-job="${CSS.escape(data.id)}"]`);
      if (old) old.replaceWith(row);
      else { body.prepend(row); announce(`New job ${data.id}`); }
    } else if (name === "gone" && data) {
      const old = body.querySelector(`tr[data-job="${CSS.escape(data.id)}"]`);
      if (old) old.remove();
    } else if (name === "skills") {
      announce("The namespace's skills changed; reloading.");
      route();
    }
  }, (text) => { state.textContent = `(${text})`; });
}

function facts(pairs) {
  return el("dl", { class: "facts" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

async function skillView(namespace, name) {
  stopLive();
  crumbs([["Namespaces", "#/"], [namespace, `#/ns/${encodeURIComponent(namespace)}`], [name, `#/ns/${encodeURIComponent(namespace)}/skill/${encodeURIComponent(name)}`]]);
  const skill = await api(`${ns(namespace)}/skills/${encodeURIComponent(name)}`);
  const fileView = el("div", { id: "file-view" });
  const files = skill.files.map((f) => el("li", {},
    el("button", { type: "button", onclick: async () => {
      try {
        const file = await api(`${ns(namespace)}/skills/${encodeURIComponent(name)}/file?path=${encodeURIComponent(f.path)}`);
        const content = file.encoding === "utf-8" ? file.content : `(${file.size} bytes of binary content, base64)\n${file.content}`;
        clear(fileView).append(el("h3", {}, f.path), el("pre", { tabindex: "0" }, content));
      } catch (err) {
        clear(fileView).append(el("p", { class: "alert", role: "alert" }, err.message));
      }
    } }, f.path), ` ${f.size} bytes`));
  const runnable = skill.scripts.filter((s) => s.status === "runnable");
  show(`Skill ${skill.name}`,
    el("p", { id: "skill-description" }, skill.description),
    el("h2", {}, "Instructions"),
    el("pre", { id: "instructions", tabindex: "0" }, skill.body),
    skill.bodyTruncated ? el("p", { class: "hint" }, "The instructions are longer than shown.") : "",
    el("h2", {}, "Files"),
    el("ul", { class: "plain", id: "files" }, files),
    fileView,
    el("h2", {}, "Run a script"),
    runnable.length ? runForm(namespace, skill.name, runnable) : el("p", {}, "No script of this skill may run here."));
}

function runForm(namespace, skill, scripts) {
  const script = el("select", { id: "run-script", name: "script" }, scripts.map((s) => el("option", { value: s.script }, s.script)));
  const args = el("textarea", { id: "run-args", name: "args", "aria-describedby": "run-args-hint" });
  const out = el("div", { id: "run-out" });
  const call = () => ({ skill, script: script.value, args: args.value === "" ? [] : args.value.split("\n") });
  const confirmRun = async (body, tokenValue, button) => {
    button.disabled = true;
    try {
      const result = await api(`${ns(namespace)}/run`, { method: "POST", json: { ...body, confirm: tokenValue } });
      const job = result.job;
      announce(`Run started: job ${job}`);
      window.location.hash = `#/ns/${encodeURIComponent(namespace)}/job/${encodeURIComponent(job)}`;
    } catch (err) {
      button.disabled = false;
      clear(out).append(el("p", { class: "alert", role: "alert" }, `${err.message} (${err.code})`));
    }
  };
  const form = el("form", { id: "run-form", onsubmit: async (event) => {
    event.preventDefault();
    const body = call();
    clear(out);
    try {
      const answer = await api(`${ns(namespace)}/run`, { method: "POST", json: body });
      if (answer.status !== "confirmation-required") {
        clear(out).append(el("p", {}, `The run answered: ${answer.status}`));
        if (answer.job) window.location.hash = `#/ns/${encodeURIComponent(namespace)}/job/${encodeURIComponent(answer.job)}`;
        return;
      }
      const p = answer.preview;
      const c = p.command;
      const go = el("button", { type: "button", class: "primary", id: "run-confirm" }, "Run exactly this");
      go.addEventListener("click", () => confirmRun(body, answer.token, go));
      const cancel = el("button", { type: "button", id: "run-cancel", onclick: () => { clear(out); script.focus(); } }, "Cancel");
      const box = el("section", { class: "preview", id: "run-preview", "aria-labelledby": "preview-title" },
        el("h3", { id: "preview-title" }, "Nothing has run yet. Confirm this exact call:"),
        facts([
          ["Network", c.network],
          ["Sandbox", c.sandbox],
          ["Variables handed over", c.env.length ? c.env.join(", ") : "none"],
          ["Timeout", `${c.timeoutSecs} s`],
          ["Skill", p.skill],
          ["Script", p.script],
          ["Command", JSON.stringify([c.program, ...c.argv])],
          ["Limits", (c.limits || []).join("; ") || "—"],
        ]),
        el("p", { class: "hint" }, `The confirmation is valid for ${answer.expiresInSecs} s, for this call only.`),
        el("div", { class: "row" }, go, cancel));
      out.append(box);
      go.focus();
    } catch (err) {
      clear(out).append(el("p", { class: "alert", role: "alert" }, `${err.message} (${err.code})`));
    }
  } },
    el("label", { for: "run-script" }, "Script"), script,
    el("label", { for: "run-args" }, "Arguments"), args,
    el("p", { id: "run-args-hint", class: "hint" }, "One argument per line, passed as they are (no shell)."),
    el("div", { class: "row" }, el("button", { type: "submit", class: "primary", id: "run-preview-button" }, "Preview run")),
    out);
  return form;
}

async function download(url, path, button) {
  button.disabled = true;
  try {
    const response = await fetch(url.replace(/^\//, "../"), { headers: { Authorization: `Bearer ${token()}` }, cache: "no-store", credentials: "omit" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const blob = await response.blob();
    const href = URL.createObjectURL(blob);
    const a = el("a", { href, download: path.split("/").pop() });
    document.body.append(a);
    a.click();
    a.remove();
    window.setTimeout(() => URL.revokeObjectURL(href), 10000);
  } catch (err) {
    announce(`Download failed: ${err.message}`);
  } finally {
    button.disabled = false;
  }
}

function streamBlock(id, label, chunk) {
  if (!chunk) return el("p", { id, class: "hint" }, `${label}: not available until the run is over.`);
  if (chunk.error) return el("p", { id, class: "hint" }, `${label}: ${chunk.error.message}`);
  const text = chunk.encoding === "utf-8" ? chunk.content : `(binary, base64)\n${chunk.content}`;
  const more = chunk.eof ? "" : ` (first ${chunk.returned} of ${chunk.size} bytes)`;
  return el("div", {}, el("h2", {}, `${label}${more}`), el("pre", { id, tabindex: "0" }, text));
}

async function jobView(namespace, id) {
  crumbs([["Namespaces", "#/"], [namespace, `#/ns/${encodeURIComponent(namespace)}`], [id, `#/ns/${encodeURIComponent(namespace)}/job/${encodeURIComponent(id)}`]]);
  const detail = await api(`${ns(namespace)}/jobs/${encodeURIComponent(id)}`);
  const job = detail.job;
  const run = job.run || {};
  const state = el("span", { class: "live", id: "live" }, "connecting…");
  const downloads = detail.downloads.map((d) => {
    const button = el("button", { type: "button" }, `Download ${d.path}`);
    button.addEventListener("click", () => download(d.url, d.path, button));
    return el("li", {}, button);
  });
  show(`Job ${job.id}`,
    facts([
      ["State", stateBadge(job.state)],
      ["Skill", job.skill],
      ["Script", run.script || "—"],
      ["Arguments", run.args ? JSON.stringify(run.args) : "—"],
      ["Exit code", run.exitCode === undefined || run.exitCode === null ? "—" : String(run.exitCode)],
      ["Created", when(job.createdAtMs)],
      ["Started", when(run.startedAtMs)],
      ["Finished", when(run.finishedAtMs)],
      ["Duration", duration(run)],
      ["Note", run.note || "—"],
    ]),
    el("p", {}, state),
    streamBlock("stdout", "stdout", detail.streams.stdout),
    streamBlock("stderr", "stderr", detail.streams.stderr),
    el("h2", {}, "Output files"),
    downloads.length ? el("ul", { class: "plain", id: "outputs" }, downloads) : el("p", { id: "outputs" }, "None."));
  const finished = !["created", "running"].includes(job.state);
  if (finished) {
    stopLive();
    state.textContent = "";
    return;
  }
  follow(namespace, (name, data) => {
    if (name === "job" && data && data.id === id && data.state !== job.state) {
      announce(`Job ${id} is ${data.state}`);
      route();
    }
  }, (text) => { state.textContent = `(${text})`; });
}

// ---------------------------------------------------------------- routing

/**
 * Shows `hash`'s page, once. A changed hash is routed by its hashchange
 * event alone: routing here too rendered the page twice, and a token typed
 * into the first sign-in form was lost when the second replaced it.
 */
function go(hash) {
  if (window.location.hash === hash) route();
  else window.location.hash = hash;
}

async function route() {
  const hash = window.location.hash.replace(/^#/, "") || "/";
  const parts = hash.split("/").filter(Boolean).map(decodeURIComponent);
  if (!token() || parts[0] === "login") return login();
  try {
    // Who is signed in is shown when it arrives; the view does not wait for
    // it (a refused token is answered 401 by the view's own calls too).
    if (document.getElementById("signout").hidden) whoami().catch(() => {});
    if (parts.length === 0) return await namespacesView();
    if (parts[0] === "ns" && parts.length === 2) return await namespaceView(parts[1]);
    if (parts[0] === "ns" && parts[2] === "skill" && parts.length === 4) return await skillView(parts[1], parts[3]);
    if (parts[0] === "ns" && parts[2] === "job" && parts.length === 4) return await jobView(parts[1], parts[3]);
    stopLive();
    show("Not found", el("p", {}, "No such page."), el("p", {}, el("a", { href: "#/" }, "Back to your namespaces")));
  } catch (err) {
    stopLive();
    failure(err, parts[0] === "ns" ? `namespace ${parts[1]}` : "this page");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("signout").addEventListener("click", () => {
    window.sessionStorage.removeItem(TOKEN_KEY);
    go("#/login");
  });
  document.getElementById("skip").addEventListener("click", (event) => {
    event.preventDefault();
    main().focus();
  });
  window.addEventListener("hashchange", route);
  route();
});
