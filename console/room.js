// A room's live view: its members with their sessions and states, and
// its event stream. On a node the browser client follows the room
// unlisted (present: false) with an observer token from the API; where
// no token is minted (an aggregator) the members are read every 2 s and
// the events are what changed between two reads.
const POLL_MS = 2000;
const MAX_EVENTS = 200;

export async function openRoom(id, ui) {
  const view = { id, closed: false, close() {} };
  const members = document.getElementById("members");
  const events = document.getElementById("events");
  members.replaceChildren();
  events.replaceChildren();
  const log = (type, user, text) => {
    const at = new Date().toLocaleTimeString();
    events.prepend(ui.el("li", { text: `${at} ${type} ${user}${text ? " " + text : ""}`, data: { type, user } }));
    while (events.children.length > MAX_EVENTS) events.lastChild.remove();
  };
  const render = (list, total) => {
    document.getElementById("room-total").textContent = `(${total})`;
    members.replaceChildren(...list.map((m) => ui.el("li", { data: { user: m.user } },
      ui.el("strong", { text: m.user }), " ", ui.disconnectButton(m.user),
      ...m.sessions.map((s) => ui.el("span", { cls: "session", data: { session: s.id } },
        ui.el("code", { text: s.id }), " ", ui.el("span", { text: s.state === undefined ? "(no state)" : JSON.stringify(s.state), data: { k: "state" } }))))));
  };
  if (!ui.live) return polled(view, ui, render, log);
  try {
    const tok = await ui.api("POST", "/v1/observer-token", { room: id });
    return live(view, tok, ui, render, log);
  } catch (err) {
    ui.mode("error: " + err.message);
    return view;
  }
}

async function live(view, tok, ui, render, log) {
  const { createClient } = await import("/v1/client.js");
  let first = tok.token;
  const client = createClient({
    url: "/v1/ws",
    sessionId: "console-" + Math.random().toString(36).slice(2, 12),
    getToken: async () => {
      if (first) { const t = first; first = null; return t; }
      return (await ui.api("POST", "/v1/observer-token", { room: view.id })).token;
    },
  });
  const room = client.room(view.id, { detail: "sessions", present: false });
  const show = () => render(room.members(), room.total);
  room.subscribe(show);
  room.on("sync", () => log("sync", "", "(snapshot)"));
  room.on("join", (m, c) => log("join", m.user, "(" + c.reason + ")"));
  room.on("leave", (m, c) => log("leave", m.user, "(" + c.reason + ")"));
  room.on("update", (m, c) => log("update", m.user, `${c.session} ${c.reason}${c.state === undefined ? "" : " " + JSON.stringify(c.state)}`));
  client.on("status", (s) => ui.mode("live, " + s));
  room.on("error", (e) => log("error", "", e.message));
  ui.mode("live, " + client.status);
  view.close = () => { view.closed = true; client.close(); };
  return view;
}

function polled(view, ui, render, log) {
  let last = null;
  const read = async () => {
    if (view.closed) return;
    try {
      const snap = await ui.api("GET", "/v1/rooms/" + encodeURIComponent(view.id) + "/members?limit=1000");
      render(snap.members, snap.total);
      if (last) diff(last, snap.members, log);
      last = snap.members;
      ui.mode("polled every 2 s (this server has no WebSocket)");
    } catch (err) {
      ui.mode("read failed: " + err.message);
    }
  };
  read();
  const timer = setInterval(read, POLL_MS);
  view.close = () => { view.closed = true; clearInterval(timer); };
  return view;
}

// diff logs what changed between two reads of the members.
function diff(before, after, log) {
  const key = (m) => new Map(m.sessions.map((s) => [s.id, JSON.stringify(s.state)]));
  const old = new Map(before.map((m) => [m.user, key(m)]));
  for (const m of after) {
    const was = old.get(m.user);
    if (!was) { log("join", m.user, ""); continue; }
    for (const [id, st] of key(m)) if (was.get(id) !== st) log("update", m.user, `${id} ${st === undefined ? "" : st}`);
    old.delete(m.user);
  }
  for (const user of old.keys()) log("leave", user, "");
}
