// The operator console. Every figure comes from the HTTP API with the
// admin key the operator typed (kept in this tab's sessionStorage only);
// a room's live view uses the browser client (room.js). Everything is
// rendered with textContent: ids and states are data, never markup.
import { openRoom } from "/console/room.js";

const $ = (id) => document.getElementById(id);
const KEY = "presence.console.key";
const EVERY_MS = 2000;
const MAX_ROOM_PAGES = 10; // of 1000 rooms each
const MAX_ROWS = 200;
let key = "";
let timer = null;
let roomsSeen = [];
let flap = null;
let openView = null;
let tokens = false; // the server mints observer tokens: rooms are followed live

// el makes an element with text and data attributes; children appended.
export function el(tag, opts = {}, ...children) {
  const e = document.createElement(tag);
  if (opts.cls) e.className = opts.cls;
  if (opts.text !== undefined) e.textContent = String(opts.text);
  for (const [k, v] of Object.entries(opts.data || {})) e.dataset[k] = String(v);
  for (const c of children) if (c) e.append(c);
  return e;
}

// api calls the HTTP API with the key; a refusal throws with its status.
export async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + key };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, cache: "no-store", body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  try { data = await r.json(); } catch { /* not JSON: the status says it */ }
  if (!r.ok) {
    const err = new Error((data && data.error) || "HTTP " + r.status);
    err.status = r.status;
    throw err;
  }
  return data;
}

function refusal(err) {
  switch (err.status) {
    case 401: return "Unknown API key.";
    case 403: return "This key's scope is read: the console needs an admin key.";
    case 404: return "The HTTP API is off on this server: no API key is configured.";
    case 429: return "Over the key's rate limit; try again in a moment.";
  }
  return "Could not log in: " + err.message;
}

async function login(k) {
  key = k;
  try {
    const regions = await api("GET", "/v1/regions");
    sessionStorage.setItem(KEY, k);
    $("login").hidden = true;
    $("app").hidden = false;
    $("logout").hidden = false;
    $("view").textContent = "view: " + regions.region;
    document.body.dataset.view = regions.region;
    tokens = regions.observer_tokens;
    renderRegions(regions);
    await refresh();
    timer = setInterval(refresh, EVERY_MS);
  } catch (err) {
    key = "";
    sessionStorage.removeItem(KEY);
    $("login-error").textContent = refusal(err);
  }
}

function logout(message) {
  clearInterval(timer);
  if (openView) openView.close();
  openView = null;
  key = "";
  sessionStorage.removeItem(KEY);
  $("app").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("view").textContent = "";
  $("login-error").textContent = message || "";
}

async function refresh() {
  const results = await Promise.allSettled([
    api("GET", "/v1/regions").then(renderRegions),
    api("GET", "/v1/nodes").then(renderNodes),
    api("GET", "/v1/flapping?limit=100").then((f) => { flap = f; renderFlapping(f); }),
    listRooms().then((rs) => { roomsSeen = rs; }),
  ]);
  const failed = results.find((r) => r.status === "rejected");
  if (failed && (failed.reason.status === 401 || failed.reason.status === 403)) {
    logout(refusal(failed.reason));
    return;
  }
  renderRooms();
  $("status").textContent = failed ? "Last refresh failed: " + failed.reason.message : "Updated " + new Date().toLocaleTimeString();
  document.body.dataset.refreshed = String(Date.now());
}

// listRooms pages through /v1/rooms, at most MAX_ROOM_PAGES pages.
async function listRooms() {
  let out = [];
  let cursor = "";
  for (let i = 0; i < MAX_ROOM_PAGES; i++) {
    const page = await api("GET", "/v1/rooms?limit=1000" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
    out = out.concat(page.rooms);
    cursor = page.next_cursor;
    if (!cursor) break;
  }
  return out;
}

const when = (t) => (!t ? "–" : t.startsWith("0001-") ? "never" : new Date(t).toLocaleTimeString());
const cell = (text, k, cls) => el("td", { text, data: k ? { k } : {}, cls });

function fill(id, rows) {
  $(id).tBodies[0].replaceChildren(...rows);
}

function renderRegions(r) {
  fill("regions", r.regions.map((g) => el("tr", { data: { region: g.region } },
    cell(g.region, "region"), cell(g.state, "state", "state-" + g.state), cell(when(g.heard), "heard"))));
}

function renderNodes(r) {
  fill("nodes", r.nodes.map((n) => {
    const over = n.heartbeat_ms > n.heartbeat_budget_ms;
    return el("tr", { data: { node: n.id, region: n.region } },
      cell(n.id.slice(0, 10), "id"), cell(n.region, "region"), cell(n.state, "state", "state-" + n.state),
      cell(n.version, "version"), cell(n.connections, "connections", "num"), cell(n.sessions, "sessions", "num"),
      cell(n.rooms, "rooms", "num"),
      cell(n.heartbeat_ms.toFixed(1) + " / " + n.heartbeat_budget_ms.toFixed(0) + " ms", "heartbeat", over ? "num over" : "num"),
      cell(n.join_rate.toFixed(2), "joins", "num"));
  }));
}

function renderFlapping(f) {
  const o = f.overall;
  const mins = Math.max(1, (Date.parse(f.at) - Date.parse(f.since)) / 60000);
  $("flap-overall").textContent = `${o.events_per_user_per_minute.toFixed(2)} presence events per user per minute overall ` +
    `(${o.events} events of ${o.users} users over the last ${mins.toFixed(1)} min)`;
  $("flap-overall").dataset.rate = String(o.events_per_user_per_minute);
  $("flap-overall").dataset.events = String(o.events);
  fill("flappers", f.users.map((u) => el("tr", { data: { user: u.user } },
    cell(u.user, "user"), cell(u.transitions, "transitions", "num"), cell(u.flaps, "flaps", "num"),
    cell(u.rooms, "rooms", "num"), el("td", {}, disconnectButton(u.user)))));
  $("flap-none").hidden = f.users.length > 0;
}

export function disconnectButton(user) {
  const b = el("button", { cls: "danger", text: "Disconnect", data: { disconnect: user } });
  b.type = "button";
  b.addEventListener("click", async () => {
    b.disabled = true;
    try {
      await api("POST", "/v1/users/" + encodeURIComponent(user) + "/disconnect");
      $("action").textContent = "Disconnected " + user + ": every node was told to close the user's connections.";
    } catch (err) {
      $("action").textContent = "Disconnect " + user + " failed: " + err.message;
    }
    document.body.dataset.lastAction = "disconnect " + user;
    b.disabled = false;
  });
  return b;
}

// renderRooms lists the rooms with members and those that churned in the
// window, filtered, sorted by members or by churn.
function renderRooms() {
  const churn = new Map((flap ? flap.rooms : []).map((c) => [c.room, c]));
  const all = new Map(roomsSeen.map((r) => [r.room, { room: r.room, count: r.count }]));
  for (const room of churn.keys()) if (!all.has(room)) all.set(room, { room, count: 0 });
  const q = $("filter").value.trim();
  let rows = [...all.values()].filter((r) => !q || r.room.includes(q));
  for (const r of rows) r.churn = churn.get(r.room) || { events: 0, events_per_user_per_minute: 0, flaps: 0 };
  const byChurn = $("sort").value === "churn";
  rows.sort((a, b) => (byChurn ? b.churn.events - a.churn.events : b.count - a.count) || a.room.localeCompare(b.room));
  const total = rows.length;
  rows = rows.slice(0, MAX_ROWS);
  fill("rooms", rows.map((r) => {
    const tr = el("tr", { cls: "pick" + (openView && openView.id === r.room ? " chosen" : ""), data: { room: r.room } },
      cell(r.room, "room"), cell(r.count, "count", "num"), cell(r.churn.events, "events", "num"),
      cell(r.churn.events_per_user_per_minute.toFixed(2), "rate", "num"), cell(r.churn.flaps, "flaps", "num"));
    tr.addEventListener("click", () => showRoom(r.room));
    return tr;
  }));
  $("rooms-note").textContent = total > rows.length ? `Showing ${rows.length} of ${total} rooms.` : `${total} rooms.`;
}

async function showRoom(id) {
  if (openView) openView.close();
  $("room-card").hidden = false;
  $("room-id").textContent = id;
  openView = await openRoom(id, { api, el, disconnectButton, live: tokens, mode: (m) => { $("room-mode").textContent = m; $("room-card").dataset.mode = m; } });
  renderRooms();
}

function boot() {
  $("login").addEventListener("submit", (e) => { e.preventDefault(); login($("key").value.trim()); });
  $("logout").addEventListener("click", () => logout(""));
  $("filter").addEventListener("input", renderRooms);
  $("sort").addEventListener("change", renderRooms);
  const saved = sessionStorage.getItem(KEY);
  if (saved) login(saved);
  document.body.dataset.ready = "1";
}

boot();
