// nanobot's page: sign in with an API key, chat (streamed), status. Every text from the
// server is set with textContent, never as HTML, so a stored "<script>" shows as text. The key
// travels only in the Authorization header (never a cookie), so another site cannot make
// the browser send it.
"use strict";
const $ = (id) => document.getElementById(id);
let key = sessionStorage.getItem("nanobot-key") || "";

async function api(path, options = {}) {
  const response = await fetch(path, {...options, headers: {...(options.headers || {}),
    "Authorization": "Bearer " + key, "Content-Type": "application/json"}});
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error((body.error && body.error.message) || response.statusText);
  }
  return response;
}

function show(view) {
  for (const id of ["sign-in", "chat", "status", "cron", "pairing", "usage"]) $(id).hidden = id !== view;
  $("nav").hidden = view === "sign-in";
  if (view === "chat") $("text").focus();
}

function add(role, text) {
  const item = document.createElement("li");
  item.className = role;
  item.textContent = text;
  $("messages").append(item);
  item.scrollIntoView({block: "end"});
  return item;
}

async function signIn(candidate) {
  key = candidate;
  try {
    await api("/v1/models");
  } catch (error) {
    key = "";
    $("sign-in-error").textContent = "That key does not work: " + error.message;
    return;
  }
  sessionStorage.setItem("nanobot-key", key);
  $("sign-in-error").textContent = "";
  await loadHistory();
  route();
}

async function loadHistory() {
  const history = await (await api("/v1/nanobot/history")).json();
  $("messages").replaceChildren();
  for (const message of history.messages) add(message.role, message.content);
}

async function send(text) {
  add("user", text);
  const reply = add("assistant", "…");
  try {
    const response = await api("/v1/chat/completions", {method: "POST", body: JSON.stringify(
      {model: "nanobot", stream: true, messages: [{role: "user", content: text}]})});
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "", shown = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      const events = buffer.split("\n\n");
      buffer = events.pop();
      for (const event of events) {
        if (!event.startsWith("data: {")) continue;
        const piece = JSON.parse(event.slice(6)).choices[0].delta.content;
        if (piece) { shown += piece; reply.textContent = shown; }
      }
    }
  } catch (error) {
    reply.textContent = "Error: " + error.message;
  }
}

async function loadStatus() {
  try {
    $("status-text").textContent = (await (await api("/v1/nanobot/status")).json()).lines.join("\n");
  } catch (error) {
    $("status-text").textContent = error.message;
  }
}


function el(tag, text, attributes = {}) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

function button(label, action) {
  const node = el("button", label, {type: "button"});
  node.addEventListener("click", async () => {
    node.disabled = true;
    try { await action(); } catch (error) { alert(error.message); }
    route();
  });
  return node;
}

const post = (path, body = {}) => api(path, {method: "POST", body: JSON.stringify(body)});

async function loadCron() {
  const jobs = (await (await api("/v1/nanobot/cron")).json()).jobs;
  $("cron-note").textContent = jobs.length ? "" : "No cron jobs.";
  $("jobs").replaceChildren(...jobs.map((job) => {
    const item = el("li");
    item.append(el("strong", job.name), el("span", ` ${job.schedule} → ${job.target} · ` +
      (job.enabled ? "enabled" : "disabled") + (job.last_status ? ` · last run ${job.last_status}` : "")));
    const actions = el("div");
    actions.append(button(job.enabled ? "Disable" : "Enable",
                          () => post(`/v1/nanobot/cron/${job.id}/${job.enabled ? "disable" : "enable"}`)),
                   button("Run now", () => post(`/v1/nanobot/cron/${job.id}/run`)));
    item.append(actions);
    for (const run of job.runs) item.append(el("pre", `${run.started} ${run.status}\n${run.output}`));
    return item;
  }));
}

async function loadPairing() {
  const data = await (await api("/v1/nanobot/pairing")).json();
  $("pairing-note").textContent = data.pending.length ? "" : "Nobody is waiting.";
  $("requests").replaceChildren(...data.pending.map((r) => {
    const item = el("li", `${r.channel} ${r.sender_id} (${r.sender_name || "?"}) · code ${r.code} `);
    item.append(button("Approve", () => post("/v1/nanobot/pairing/approve", {code: r.code})),
                button("Deny", () => post("/v1/nanobot/pairing/deny", {code: r.code})));
    return item;
  }));
  $("paired").replaceChildren(...data.paired.map((u) => el("li", `${u.channel} ${u.sender_id} (${u.sender_name || "?"})`)));
}

async function loadUsage() {
  const days = (await (await api("/v1/nanobot/usage")).json()).days;
  const measure = days.some((d) => d.cost > 0) ? "cost" : "calls";
  const top = Math.max(...days.map((d) => d[measure]), 1e-9);
  const width = 300 / days.length;
  $("chart").replaceChildren(...days.map((d, i) => {
    const bar = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const height = (d[measure] / top) * 96;
    for (const [name, value] of Object.entries({x: i * width + 1, y: 100 - height, width: width - 2, height}))
      bar.setAttribute(name, value);
    bar.append(document.createElementNS("http://www.w3.org/2000/svg", "title"));
    bar.firstChild.textContent = `${d.day}: ${d.calls} calls, ${d.tokens} tokens, $${d.cost.toFixed(4)}`;
    return bar;
  }));
  $("usage-note").textContent = `Last 30 days, ${measure} per day: ` +
    `${days.reduce((n, d) => n + d.calls, 0)} calls, $${days.reduce((n, d) => n + d.cost, 0).toFixed(4)}.`;
  $("days").replaceChildren(...days.filter((d) => d.calls).map((d) =>
    el("li", `${d.day}: ${d.calls} calls, ${d.tokens} tokens, $${d.cost.toFixed(4)}`)));
}

const VIEWS = {"#status": loadStatus, "#cron": loadCron, "#pairing": loadPairing, "#usage": loadUsage};

async function route() {
  if (!key) return show("sign-in");
  const load = VIEWS[location.hash];
  if (!load) return show("chat");
  show(location.hash.slice(1));
  try { await load(); } catch (error) { $(location.hash.slice(1) + "-note").textContent = error.message; }
}

$("sign-in").addEventListener("submit", (event) => { event.preventDefault(); signIn($("key").value.trim()); });
$("text").addEventListener("keydown", (event) => {
  if (event.key !== "Enter" || event.shiftKey) return;
  event.preventDefault();
  const text = $("text").value.trim();
  $("text").value = "";
  if (text) send(text);
});
$("sign-out").addEventListener("click", () => { sessionStorage.removeItem("nanobot-key"); key = ""; route(); });
window.addEventListener("hashchange", route);
if (key) signIn(key); else route();
