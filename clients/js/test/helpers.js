// Test doubles: fake time, a fake WebSocket, a fake BroadcastChannel bus.
// Nothing here sleeps: tests drive time with clock.advance().
import { createClient } from "../client.js";

export const flush = () => new Promise((r) => setImmediate(r)); // drains pending microtasks

export class FakeClock {
  constructor(start = Date.parse("2026-11-29T19:00:00Z")) {
    this.t = start;
    this.timers = new Map();
    this.seq = 0;
    this.now = () => this.t;
    this.setTimeout = (fn, ms) => {
      const id = ++this.seq;
      this.timers.set(id, { at: this.t + Math.max(0, Number(ms) || 0), fn, id });
      return id;
    };
    this.clearTimeout = (id) => { this.timers.delete(id); };
  }
  next(limit = Infinity) {
    let best = null;
    for (const t of this.timers.values()) {
      if (t.at <= limit && (!best || t.at < best.at || (t.at === best.at && t.id < best.id))) best = t;
    }
    return best;
  }
  // Runs every timer due within ms, in order, flushing microtasks between.
  async advance(ms) {
    const end = this.t + ms;
    await flush();
    for (;;) {
      const t = this.next(end);
      if (!t) break;
      this.t = t.at;
      this.timers.delete(t.id);
      t.fn();
      await flush();
    }
    this.t = end;
    await flush();
  }
}

export function fakeSockets() {
  const sockets = [];
  class FakeWebSocket {
    constructor(url, protocols) {
      this.url = url;
      this.protocols = protocols;
      this.sent = [];
      this.readyState = 0;
      this.closedByClient = null;
      sockets.push(this);
    }
    send(data) {
      if (this.readyState !== 1) throw new Error("send on a socket that is not open");
      this.sent.push({ frame: JSON.parse(data), at: FakeWebSocket.clock ? FakeWebSocket.clock.t : 0 });
    }
    close(code, reason) {
      this.closedByClient = { code, reason };
      this.readyState = 3;
    }
    // -- the server's side --
    open() { this.readyState = 1; if (this.onopen) this.onopen({}); }
    recv(obj) { if (this.onmessage) this.onmessage({ data: typeof obj === "string" ? obj : JSON.stringify(obj) }); }
    serverClose(code, reason = "") { this.readyState = 3; if (this.onclose) this.onclose({ code, reason }); }
    frames(type) { return this.sent.map((s) => s.frame).filter((f) => !type || f.type === type); }
    last(type) { const f = this.frames(type); return f[f.length - 1]; }
  }
  return { WebSocket: FakeWebSocket, sockets, get last() { return sockets[sockets.length - 1]; } };
}

export function hello(extra = {}) {
  return {
    type: "hello", v: 1, region: "eu", user: "u1", session: "s1",
    limits: { max_rooms: 32, max_frame_bytes: 4096, max_state_bytes: 1024, frame_rate: 10, frame_burst: 20, ping_interval_ms: 25000 },
    ...extra,
  };
}

// A client on fake everything. opts override the defaults.
export function setup(opts = {}) {
  const clock = new FakeClock();
  const ws = fakeSockets();
  ws.WebSocket.clock = clock;
  const errors = [];
  const statuses = [];
  const client = createClient({
    url: "ws://node.test/v1/ws",
    sessionId: "s1",
    WebSocket: ws.WebSocket,
    setTimeout: clock.setTimeout,
    clearTimeout: clock.clearTimeout,
    now: clock.now,
    random: () => 0.5,
    window: null,
    BroadcastChannel: null,
    ...opts,
  });
  client.on("error", (e) => errors.push(e));
  client.on("status", (s) => statuses.push(s));
  return { clock, ws, client, errors, statuses };
}

// Opens the newest socket and sends hello.
export async function open(h, extra) {
  await h.clock.advance(0);
  const s = h.ws.last;
  s.open();
  s.recv(hello(extra));
  await flush();
  return s;
}

export function snapshotFrame(room, members, { ref, reason = "join", seq = 0, total, offset = 0, truncated, epoch = 1, region = "eu" } = {}) {
  return {
    type: "snapshot", ref, room, reason,
    truncated: truncated ?? (total !== undefined && total > members.length),
    snapshot: { region, room, at: "2026-11-29T19:48:46Z", total: total ?? members.length, offset, members, room_seq: seq, epoch, stream_seq: 0 },
  };
}

export function eventFrame(room, seq, fields) {
  return { type: "event", event: { v: 1, id: `eu/${room}/1/${seq}`, region: "eu", room, seq, epoch: 1, at: "2026-11-29T19:48:47Z", ...fields } };
}

// One `events` frame holding the given events (objects as for eventFrame,
// each with seq), in the compact form.
export function eventsFrame(room, events, { region = "eu", epoch = 1 } = {}) {
  return {
    type: "events", room, region, epoch,
    events: events.map((e) => {
      const a = [e.seq, e.kind, e.reason, e.user, e.session ?? "", e.sessions ?? 0];
      if (e.state !== undefined) a.push(e.state);
      return a;
    }),
  };
}

// Answers the newest unanswered join of room on socket s with a snapshot.
export function answerJoin(s, room, members = [], opts = {}) {
  const j = s.frames("join").filter((f) => f.room === room).pop();
  s.recv(snapshotFrame(room, members, { ref: j.ref, ...opts }));
  return j;
}

// Plain-data view of members() for deepEqual.
export function plain(members) { return JSON.parse(JSON.stringify(members)); }
