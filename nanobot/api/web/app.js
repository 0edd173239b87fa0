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
  for (const id of ["sign-in", "chat", "status"]) $(id).hidden = id !== view;
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

function route() {
  if (!key) return show("sign-in");
  if (location.hash === "#status") { show("status"); loadStatus(); } else show("chat");
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
