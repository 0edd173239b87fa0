// nanobot's page: sign in with an API key; conversations, a chat that renders Markdown as it
// streams, its mode, model, Stop and attachments; status, cron, pairing and usage for owners.
// Replies are Markdown rendered by markdown-it with raw HTML off, then sanitized by DOMPurify
// (both vendored, see vendor/README.md); everything else from the server is set as text. The key
// travels only in the Authorization header (never a cookie), so another site cannot make the
// browser send it.
"use strict";
const $ = (id) => document.getElementById(id);
const md = window.markdownit({html: false, linkify: true, breaks: true});
let key = sessionStorage.getItem("nanobot-key") || "";
let session = sessionStorage.getItem("nanobot-session") || null;  // X-Nanobot-Session: null is the key's own chat
let viewing = null;  // an owner reading another channel's chat (read-only)
let running = false;  // a turn of this conversation is being answered
// Settles once the gateway has the running message (its answer's headers come after it is queued):
// a Stop pressed sooner waits for it, or the /stop would overtake the message and stop nothing.
let accepted = Promise.resolve();
let attachments = [];  // uploaded files for the next message: {id, name}
// The newest notice the Status view showed (its id): news counts those after it, for the Status link.
let noticesSeen = Number(localStorage.getItem("nanobot-notices-seen")) || 0;
let keptUpto = -1;  // where the last message kept for us that the chat shows is (a task's result, a job's output)
let redraws = 0;  // counts the chat's redraws (loadChat): news asked across one is dropped
// How often the open chat asks for what reached it with nobody asking: soon after a message (a task
// it started may end), ever more seldom while nothing happens (among workers it may be a database read).
const NEWS_EVERY_MS = 3000, NEWS_IDLE_MS = 30000;
let newsDelay = NEWS_EVERY_MS;
const OWNER_VIEWS = ["status", "cron", "pairing", "usage"];
const AUDIO = /\.(ogg|oga|opus|mp3|m4a|aac|wav)$/i;  // files the page plays (a spoken reply is reply.ogg)

function el(tag, text, attributes = {}) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

// Paths are relative to the page ("v1/..."): behind a proxy it may live under a path
// (at home.example/nanobot/, say).
async function api(path, options = {}) {
  const headers = {"Authorization": "Bearer " + key, ...(options.headers || {})};
  if (session && !path.includes("chat=")) headers["X-Nanobot-Session"] = session;
  if (!(options.body instanceof Blob)) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {...options, headers});
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw Object.assign(new Error((body.error && body.error.message) || response.statusText), {status: response.status});
  }
  return response;
}
const post = (path, body = {}) => api(path, {method: "POST", body: JSON.stringify(body)});

// ---- Markdown ---------------------------------------------------------------------------
// Words that name a web address. A link whose words name another address than where it goes
// shows its target too: a reply a web page steered could show "bank.example" over a link
// elsewhere (the chat platforms' converters do the same: channels/text.py, misleading).
const ADDRESS = /(?:[a-z][a-z0-9+.-]*:\/\/)?(?:[\w-]+\.)+[a-z]{2,}/gi;
function misleading(link) {
  const host = link.hostname.toLowerCase().replace(/^www\./, "");
  return (link.textContent.match(ADDRESS) || []).some((named) => !named.toLowerCase().includes(host));
}

function rendered(text) {
  const box = document.createElement("div");
  box.innerHTML = DOMPurify.sanitize(md.render(text));
  for (const link of box.querySelectorAll("a")) {
    link.target = "_blank";
    link.rel = "noopener noreferrer";
    if (misleading(link)) link.append(` (${link.href})`);
  }
  // A table or a code block may scroll sideways (its words and lines kept whole): it takes the
  // keyboard's focus, so it can be scrolled without a mouse.
  for (const table of box.querySelectorAll("table")) table.tabIndex = 0;
  for (const pre of box.querySelectorAll("pre")) {
    pre.tabIndex = 0;
    const code = pre.querySelector("code") || pre;
    const language = (/language-(\S+)/.exec(code.className) || [])[1] || "text";
    const frame = el("div", undefined, {class: "code"});
    const head = el("div", undefined, {class: "code-head"});
    const copy = el("button", "Copy", {type: "button", "aria-label": `Copy the ${language} code`});
    copy.addEventListener("click", () => navigator.clipboard.writeText(code.textContent)
      .then(() => { copy.textContent = "Copied"; }, () => { copy.textContent = "Select and copy"; }));
    head.append(el("span", language), copy);
    pre.replaceWith(frame);
    frame.append(head, pre);
  }
  return [...box.childNodes];
}

function showText(item, role, text) {
  if (role === "user") item.textContent = text;
  else item.replaceChildren(...rendered(text));
}

function add(role, text, scroll = true) {
  const item = el("li", undefined, {class: role});
  showText(item, role, text);
  $("messages").append(item);
  if (scroll) item.scrollIntoView({block: "end"});
  return item;
}

// ---- signing in, views --------------------------------------------------------------------
function show(view) {
  for (const id of ["sign-in", "chat", "status", "cron", "pairing", "usage"]) $(id).hidden = id !== view;
  $("nav").hidden = view === "sign-in";
  if (view === "chat" && !viewing) $("text").focus();
}

async function signIn(candidate) {
  key = candidate;
  try {  // all at once: the key's check is the conversations' request itself
    await Promise.all([loadConversations(), loadChat()]);
  } catch (error) {
    key = "";
    sessionStorage.removeItem("nanobot-key");
    $("sign-in-error").textContent = error.status === 401 ? "That key does not work: mistyped, or revoked."
      : "Signing in failed: " + error.message;  // a rate limit, the gateway stopping: not the key's fault
    return route();
  }
  sessionStorage.setItem("nanobot-key", key);
  $("sign-in-error").textContent = "";
  await route();
  news().catch(() => {});  // at once: the Status link says if notices came meanwhile
}

// ---- conversations ---------------------------------------------------------------------
function when(stamp) {
  if (!stamp) return "";
  const date = new Date(stamp.replace(/([+-]\d\d)(\d\d)$/, "$1:$2"));
  return isNaN(date) ? stamp : date.toLocaleString([], {dateStyle: "short", timeStyle: "short"});
}

function entry(label, detail, current, open) {
  const item = el("li");
  const pick = el("button", undefined, {type: "button", "aria-current": current ? "true" : "false"});
  pick.append(el("span", label), el("small", detail));
  pick.addEventListener("click", open);
  item.append(pick);
  return item;
}

async function loadConversations() {
  const data = await (await api("v1/nanobot/conversations")).json();
  const mine = data.conversations;
  if (!viewing && !mine.some((c) => (c.session || null) === session)) mine.unshift({session, title: "(empty)", last: ""});
  $("conversation-list").replaceChildren(...mine.map((c) => entry(c.title, when(c.last),
    !viewing && (c.session || null) === session, () => openConversation(c.session || null))));
  const every = data.chats || [];
  for (const view of OWNER_VIEWS) $("nav-" + view).hidden = !data.owner;  // a member key would only be refused there
  $("every-chat").hidden = !every.length;
  $("chat-list").replaceChildren(...every.map((c) => entry(c.chat, `${c.trust} · ${c.mode} · ${c.model} · ${when(c.last)}`,
    viewing === c.chat, () => openChat(c.chat))));
}

async function openConversation(name) {
  session = name;
  viewing = null;
  if (name) sessionStorage.setItem("nanobot-session", name); else sessionStorage.removeItem("nanobot-session");
  await Promise.all([loadChat(), loadConversations()]);
  location.hash = "#chat";
  show("chat");
}

async function openChat(chat) {
  viewing = chat;
  await Promise.all([loadChat(), loadConversations()]);
  location.hash = "#chat";
  show("chat");
}

function newConversation() {
  const bytes = crypto.getRandomValues(new Uint8Array(4));
  openConversation("c" + [...bytes].map((b) => b.toString(16).padStart(2, "0")).join(""));
}

// ---- the chat -----------------------------------------------------------------------------
async function loadChat() {
  redraws += 1;
  const query = viewing ? "?chat=" + encodeURIComponent(viewing) : "";
  const [history, settings] = await Promise.all([
    api("v1/nanobot/history" + query).then((r) => r.json()),
    api("v1/nanobot/chat" + query).then((r) => r.json())]);
  $("messages").replaceChildren();
  for (const message of history.messages) {
    const item = add(message.role, message.content);
    if (message.failed) item.classList.add("failed");  // as it was shown live: the turn failed
  }
  keptUpto = history.upto;
  redraws += 1;
  $("chat-title").textContent = viewing || (session ? "Conversation " + session : "Chat");
  fill($("mode"), settings.modes, settings.mode);
  fill($("model"), settings.models, settings.model);
  $("model").title = "now: " + settings.uses;
  for (const id of ["mode", "model", "text", "send", "attach", "record"]) $(id).disabled = Boolean(viewing);
  $("read-only").hidden = !viewing;
}

function fill(select, choices, current) {
  select.replaceChildren(...choices.map((choice) => el("option", choice, choice === current ? {selected: ""} : {})));
}

function busy(on) {
  running = on;
  $("stop").hidden = !on;
  $("send").disabled = on || Boolean(viewing);
}

async function send(text) {
  const parts = attachments.map((a) => ({type: "file", file: {file_id: a.id}}));
  const content = parts.length ? [{type: "text", text}, ...parts] : text;
  const names = attachments.map((a) => a.name);
  attachments = [];
  $("attached").textContent = "";
  add("user", names.length ? `${text}\n📎 ${names.join(", ")}`.trim() : text);
  const reply = add("assistant", "…");
  busy(true);
  newsDelay = NEWS_EVERY_MS;
  try {
    const asked = post("v1/chat/completions", {model: "nanobot", stream: true, messages: [{role: "user", content}]});
    accepted = asked.catch(() => {});
    await readStream(await asked, reply);
  } catch (error) {
    reply.textContent = "Error: " + error.message;
  } finally {
    busy(false);
    loadConversations().catch(() => {});
  }
}

async function readStream(response, reply) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "", shown = "", drawing = false;
  const draw = () => { drawing = false; showText(reply, "assistant", shown); reply.scrollIntoView({block: "end"}); };
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    const events = buffer.split("\n\n");
    buffer = events.pop();
    for (const event of events) {
      if (!event.startsWith("data: {")) continue;
      const data = JSON.parse(event.slice(6));
      if (data.nanobot?.failed) reply.classList.add("failed");  // the words say the turn failed
      else if (data.nanobot) showAside(data.nanobot, reply);  // a note or a file the turn sent
      const piece = data.choices[0].delta.content;
      if (piece) shown += piece;
    }
    if (!drawing) { drawing = true; requestAnimationFrame(draw); }  // at most once a frame: no flicker
  }
  showText(reply, "assistant", shown || "(no reply)");
}

function showAside(aside, reply) {
  const item = el("li", undefined, {class: aside.file ? "file" : "note"});
  if (aside.file) showFile(item, aside.file).catch((error) => { item.textContent = `${aside.file.name}: ${error.message}`; });
  else item.replaceChildren(...rendered(aside.note));
  reply.before(item);  // notes and files come before the answer they lead to
}

// A file the assistant sent: fetched with the key (never a cookie), shown as a picture or
// offered as a download.
async function showFile(item, file) {
  const blob = await (await api("v1/nanobot/files?path=" + encodeURIComponent(file.path))).blob();
  const url = URL.createObjectURL(blob);
  const link = el("a", "Download " + file.name, {href: url, download: file.name});
  if (file.photo) item.append(el("img", undefined, {src: url, alt: file.caption || file.name}));
  if (AUDIO.test(file.name)) item.append(el("audio", undefined, {src: url, controls: "", "aria-label": file.name}));
  if (file.caption) item.append(el("p", file.caption));
  item.append(link);
}

// What reaches the chat in view with nobody asking (a background task's result, a job's output)
// shows within seconds, after what is there; not while a turn of it is answered (it comes after).
async function news() {
  if (!key || running || viewing || document.hidden || $("chat").hidden) return;
  const asked = redraws;
  const data = await (await api(`v1/nanobot/news?after=${keptUpto}&noticesAfter=${noticesSeen}`)).json();
  if (data.notices !== undefined) markNotices(data.notices);  // (an owner key's)
  if (asked !== redraws || running) return;  // redrawn (or another conversation) meanwhile, or a turn began
  const atEnd = window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 40;
  for (const text of data.messages) add("assistant", text, atEnd);  // a reader scrolled up stays where they are
  keptUpto = data.upto >= 0 ? Math.max(keptUpto, data.upto) : -1;  // -1: none waits, none can come twice
  newsDelay = data.messages.length ? NEWS_EVERY_MS : Math.min(2 * newsDelay, NEWS_IDLE_MS);
}

function askForNews() {
  news().catch(() => {}).finally(() => setTimeout(askForNews, newsDelay));  // a failure waits for the next
}

// A voice message: recorded here (the browser asks for the microphone), sent as an audio file
// that the gateway transcribes (tools.transcription); as for a voice note, the reply may be
// spoken too (tools.speech, /voice). A second press sends it; Esc throws it away.
let recorder = null;

async function record() {
  if (recorder) return recorder.stop();
  if (running || viewing) return;
  if (!navigator.mediaDevices?.getUserMedia) {  // browsers offer the microphone to secure pages only
    $("attached").textContent = "Recording needs the page on https (or on localhost): this browser offers no "
      + "microphone here.";
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({audio: true});
  } catch (error) {
    $("attached").textContent = "No microphone: " + error.message;
    return;
  }
  const chunks = [], taking = recorder = new MediaRecorder(stream);
  taking.addEventListener("dataavailable", (event) => chunks.push(event.data));
  taking.addEventListener("stop", () => {
    stream.getTracks().forEach((track) => track.stop());
    recorder = null;
    recording(false);
    if (taking.discarded || !chunks.length) return;
    const type = chunks[0].type || "audio/webm";  // Chromium and Firefox: WebM or Ogg (Opus); Safari: MP4
    const suffix = type.includes("ogg") ? "ogg" : type.includes("mp4") ? "m4a" : "webm";
    attach([new File(chunks, "voice." + suffix, {type})]).then(() => send(""))
      .catch((error) => { $("attached").textContent = "Not sent: " + error.message; });
  });
  taking.start();
  recording(true);
}

function recording(on) {
  $("record").textContent = on ? "Send voice" : "Speak";  // (its name says it: no aria-pressed beside it)
  $("record").classList.toggle("recording", on);
  $("attached").textContent = on ? "Recording: Send voice sends it, Esc throws it away."
    : attachments.map((a) => a.name).join(", ");
}

async function command(text) {
  const reply = await (await post("v1/chat/completions", {model: "nanobot",
    messages: [{role: "user", content: text}]})).json();
  await loadChat();  // the new settings, then the answer under the history it redrew
  add("note", reply.choices[0].message.content);
}

async function stop() {
  if (!running) return;
  await accepted;
  await post("v1/chat/completions", {model: "nanobot", messages: [{role: "user", content: "/stop"}]});
}

async function attach(files) {
  for (const file of files) {
    const response = await api("v1/nanobot/upload?name=" + encodeURIComponent(file.name), {method: "POST", body: file});
    attachments.push({id: (await response.json()).id, name: file.name});
  }
  $("attached").textContent = attachments.map((a) => a.name).join(", ");
  $("attach").value = "";
}

// ---- owner views --------------------------------------------------------------------------
async function loadStatus() {
  const {lines, notices} = await (await api("v1/nanobot/status")).json();
  $("status-list").replaceChildren(...lines.flatMap((line) => {
    const [name, ...rest] = line.split(":");
    return [el("dt", name.trim()), el("dd", rest.join(":").trim())];
  }));
  $("status-note").textContent = "";
  // What was announced to the owner (a new job, a steering file changed), newest first: text only
  $("notices-note").textContent = notices.length ? "" : "None in the last 30 days.";
  $("notices").replaceChildren(...notices.map((n) => el("li", `${when(n.at)} · ${n.text}`)));
  if (notices.length) localStorage.setItem("nanobot-notices-seen", noticesSeen = notices[0].id);
  markNotices(0);
}

// New notices (a member's job, a steering file changed) show on the Status link until it is opened.
function markNotices(count) {
  const link = $("nav-status");
  link.textContent = count ? `Status (${count} new)` : "Status";
  link.classList.toggle("news", count > 0);
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

async function loadCron() {
  const jobs = (await (await api("v1/nanobot/cron")).json()).jobs;
  $("cron-note").textContent = jobs.length ? "" : "No cron jobs.";
  $("jobs").replaceChildren(...jobs.map((job) => {
    const item = el("li");
    item.append(el("strong", job.name), el("small", ` ${job.id}`), el("p", `${job.schedule} (${job.timezone}) · ` +
      `${job.kind} → ${job.target} · made in ${job.made_in} · ` + (job.enabled ? "enabled" : "disabled") +
      (job.next_run ? ` · next ${when(job.next_run)}` : "") + (job.last_status ? ` · last run ${job.last_status}` : "")));
    const action = (name) => () => post(`v1/nanobot/cron/${job.id}/${name}`);
    item.append(button(job.enabled ? "Disable" : "Enable", action(job.enabled ? "disable" : "enable")),
                button("Run now", action("run")),
                button("Remove", () => confirm(`Remove the job ${job.name}?`) && action("remove")()));
    // What it runs and how its runs went, folded: a list of jobs stays a list (a failed last run opens)
    item.append(folded(job.kind === "code" ? "Its code" : "Its message", [el("pre", job.payload)]));
    if (job.runs.length) item.append(folded(`Last runs (${job.runs.length})`, job.runs.map((run) =>
      el("pre", `${when(run.started)} ${run.status}\n${run.output}`)), job.last_status === "error"));
    return item;
  }));
}

function folded(title, nodes, open = false) {
  const details = el("details");
  details.open = open;
  details.append(el("summary", title), ...nodes);
  return details;
}

async function loadPairing() {
  const data = await (await api("v1/nanobot/pairing")).json();
  $("pairing-note").textContent = data.pending.length ? "" : "Nobody is waiting.";
  $("requests").replaceChildren(...data.pending.map((r) => {
    const item = el("li", `${r.channel} ${r.sender_id} (${r.sender_name || "?"}) · code ${r.code} `);
    item.append(button("Approve", () => post("v1/nanobot/pairing/approve", {code: r.code})),
                button("Deny", () => post("v1/nanobot/pairing/deny", {code: r.code})));
    return item;
  }));
  $("paired-note").textContent = data.paired.length ? "" : "Nobody yet.";
  $("paired").replaceChildren(...data.paired.map((u) => {
    const who = `${u.channel} ${u.sender_id} (${u.sender_name || "?"})`, item = el("li", `${who} `);
    item.append(button("Revoke", () => confirm(`Take back ${who}'s approval?`) &&
                                        post("v1/nanobot/pairing/revoke", {channel: u.channel, sender_id: u.sender_id})));
    return item;
  }));
}

const COLORS = ["#4a7bd0", "#d0834a", "#4ab07a", "#b04a9c", "#9c9c3a", "#4aa8b0"];
const svg = (tag, attributes, text) => {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
};

async function loadUsage() {
  const data = await (await api("v1/nanobot/usage")).json();
  const days = data.days;
  const measure = days.some((d) => d.cost > 0) ? "cost" : "calls";
  const models = [...new Set(days.flatMap((d) => Object.keys(d.models)))];
  const most = Math.max(...days.map((d) => d[measure]));
  // A round number on top (1, 2, 4 or 5 times a power of ten), so the middle line is round too:
  // $0.30 and $0.15, not $0.2630 and $0.1315; calls: at least 2, whole numbers both.
  const top = measure === "cost" ? roundUp(Math.max(most, 1e-4)) : Math.max(2, roundUp(most));
  const cents = Math.max(2, Math.ceil(-Math.log10(top / 2)));  // the middle's digits, at least cents
  const label = (v) => measure === "cost" ? "$" + v.toFixed(cents) : String(Math.round(v));
  const [left, bottom, width, height] = [56, 212, 576, 196];
  const step = width / days.length;
  const nodes = [svg("line", {x1: left, y1: bottom, x2: left + width, y2: bottom}),
                 svg("line", {x1: left, y1: bottom - height, x2: left, y2: bottom})];
  for (const f of [0, 0.5, 1]) {
    nodes.push(svg("text", {x: left - 6, y: bottom - f * height + 4, "text-anchor": "end"}, label(top * f)));
    nodes.push(svg("line", {x1: left, y1: bottom - f * height, x2: left + width, y2: bottom - f * height, opacity: 0.4}));
  }
  days.forEach((d, i) => {
    let y = bottom;
    models.forEach((m, n) => {
      const value = (d.models[m] || {})[measure] || 0;
      const h = (value / top) * height;
      if (h > 0) {
        const bar = svg("rect", {x: left + i * step + 1, y: y - h, width: Math.max(step - 2, 1), height: h, fill: COLORS[n % COLORS.length]});
        bar.append(svg("title", {}, `${d.day} ${m}: ${(d.models[m] || {}).calls || 0} calls, $${((d.models[m] || {}).cost || 0).toFixed(4)}`));
        nodes.push(bar);
        y -= h;
      }
    });
    if (i % 5 === 0 || i === days.length - 1)
      nodes.push(svg("text", {x: left + i * step + step / 2, y: bottom + 16, "text-anchor": "middle"}, d.day.slice(5)));
  });
  $("chart").replaceChildren(...nodes);
  $("chart").setAttribute("aria-label", `${measure} per day and model, last 30 days`);
  $("legend").replaceChildren(...models.map((m, n) => {
    const item = el("li", m), swatch = el("span");
    swatch.style.background = COLORS[n % COLORS.length];  // CSSOM: the page's CSP drops a style="" attribute
    item.prepend(swatch);
    return item;
  }));
  const calls = days.reduce((n, d) => n + d.calls, 0), cost = days.reduce((n, d) => n + d.cost, 0);
  const tokens = days.reduce((n, d) => n + d.tokens, 0), cached = days.reduce((n, d) => n + d.cached, 0);
  const n = (v) => v.toLocaleString("en-US");  // 612,015 tokens, not 612015
  $("usage-note").textContent = `Last 30 days: ${n(calls)} calls, ${n(tokens)} tokens (${n(cached)} cached), $${cost.toFixed(4)}.`;
  $("top-chats").tBodies[0].replaceChildren(...data.top_chats.map((c) => {
    const row = el("tr");
    row.append(el("td", c.chat), el("td", String(c.calls)), el("td", "$" + c.cost.toFixed(4)));
    return row;
  }));
  $("days").replaceChildren(...days.filter((d) => d.calls).map((d) =>
    el("li", `${d.day}: ${n(d.calls)} calls, ${n(d.tokens)} tokens (${n(d.cached)} cached), $${d.cost.toFixed(4)}`)));
}

function roundUp(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 4, 5, 10].map((m) => m * power).find((v) => v >= value * (1 - 1e-9));
}

const VIEWS = {"#status": loadStatus, "#cron": loadCron, "#pairing": loadPairing, "#usage": loadUsage};

async function route() {
  if (!key) return show("sign-in");
  const load = VIEWS[location.hash];
  if (!load) return show("chat");
  show(location.hash.slice(1));
  try { await load(); } catch (error) { $(location.hash.slice(1) + "-note").textContent = error.message; }
}

// ---- wiring -------------------------------------------------------------------------------
$("sign-in").addEventListener("submit", (event) => { event.preventDefault(); signIn($("key").value.trim()); });
$("compose").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("text").value.trim();
  if (!(text || attachments.length) || running || viewing) return;  // a file alone goes too
  $("text").value = "";
  send(text);
});
$("text").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("compose").requestSubmit(); }
});
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  if (recorder) { recorder.discarded = true; recorder.stop(); } else stop();
});
$("record").hidden = !window.MediaRecorder;  // (a browser that cannot record at all)
$("record").addEventListener("click", record);
$("stop").addEventListener("click", stop);
$("mode").addEventListener("change", () => command("/mode " + $("mode").value));
$("model").addEventListener("change", () => command("/model " + $("model").value));
$("attach").addEventListener("change", () => attach([...$("attach").files]).catch((error) => {
  $("attached").textContent = "Not attached: " + error.message;
}));
$("new-conversation").addEventListener("click", newConversation);
$("sign-out").addEventListener("click", () => { sessionStorage.clear(); key = ""; session = null; route(); });
window.addEventListener("hashchange", route);
setTimeout(askForNews, newsDelay);
if (key) signIn(key); else route();
