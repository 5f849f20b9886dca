// @presence/client: browser client for the presence service, protocol
// version 1 (docs/PROTOCOL.md). One self-contained ES module: no
// dependencies, no build step. Served as-is at /v1/client.js.

const PROTOCOL = "presence.v1";
const STORAGE_KEY = "presence.session";
const CHANNEL_NAME = "presence.session";
const MSG_TYPE = "presence.session";
// 64 symbols, so `byte & 63` is unbiased. All are in the protocol's id alphabet.
const ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const ID_RE = /^[A-Za-z0-9\-_=@+~]{1,64}$/;

const DEFAULT_LIMITS = Object.freeze({
  max_rooms: 32, max_frame_bytes: 4096, max_state_bytes: 1024,
  frame_rate: 10, frame_burst: 20, ping_interval_ms: 25000,
  max_watches: 32, max_watch_users: 100, tick_ms: 100,
});

const BACKOFF_BASE_MS = 500;
const BACKOFF_CAP_MS = 10000; // once the offline grace is over
// While the session is inside its offline grace (hello's offline_grace_ms,
// 12 s until a hello says otherwise) a reconnect announces nothing: tries
// land at most GRACE_RETRY_MS apart until GRACE_MARGIN_MS before the grace
// ends, so an outage up to grace - 2 s ends in a reconnect inside it.
const GRACE_DEFAULT_MS = 12000;
const GRACE_RETRY_MS = 1000;
const GRACE_MARGIN_MS = 1000;
const POLICY_BACKOFF_MS = 5000; // close 1008: at least this long
const QUICK_RETRY_MS = 250; // close 1001/1012: reconnect at once, tiny jitter
// Connects that end before hello: the node refused a browser's token
// with 4401 and says why; any other such close (1006: a refusal the
// browser cannot read, or no node) is reported after EARLY_CLOSES in a
// row, unless it is a blip inside the grace of a drop.
const CLOSE_UNAUTHORIZED = 4401;
const EARLY_CLOSES = 3;
// A JWS in compact form: three base64url parts (the node takes nothing else).
const JWT_RE = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;

/** Error with the protocol's error `code` (or a client-side one). */
export class PresenceError extends Error {
  constructor(code, message, extra) {
    super(message || code);
    this.name = "PresenceError";
    this.code = code;
    if (extra) Object.assign(this, extra);
  }
}

// What getToken gave, as it goes on the wire: { token } (undefined for
// none), or { err } saying why it is not a JWT. Surrounding whitespace
// (a newline at the end of a file or a response) is dropped.
function tokenOf(t) {
  if (t === undefined || t === null || t === "") return { token: undefined };
  const bad = (msg) => ({ err: new PresenceError("token_not_jwt", msg, { hint: "getToken must resolve to the JWT itself: three base64url parts joined by dots" }) });
  if (typeof t !== "string") return bad(`getToken returned ${Array.isArray(t) ? "an array" : typeof t}, not the JWT as a string`);
  const s = t.trim();
  if (JWT_RE.test(s)) return { token: s };
  const head = JSON.stringify(s.length > 32 ? s.slice(0, 32) + "…" : s);
  if (s.startsWith("<")) return bad(`getToken returned an HTML page, not a JWT (${head}): the token endpoint probably answered an error; check r.ok before r.text()`);
  if (s.startsWith("{") || s.startsWith("\"")) return bad(`getToken returned JSON, not a JWT (${head}): return the token itself, e.g. (await r.json()).token`);
  return bad(`getToken returned text that is not a JWT (${head})`);
}

function reportAsync(e) {
  // A throwing listener must not break the client's state machine.
  if (typeof reportError === "function") reportError(e);
  else queueMicrotask(() => { throw e; });
}

class Emitter {
  constructor() { this._listeners = new Map(); }
  on(type, fn) {
    let set = this._listeners.get(type);
    if (!set) this._listeners.set(type, (set = new Set()));
    set.add(fn);
    return () => this.off(type, fn);
  }
  off(type, fn) {
    const set = this._listeners.get(type);
    if (set) set.delete(fn);
  }
  _emit(type, ...args) {
    const set = this._listeners.get(type);
    if (!set) return;
    for (const fn of [...set]) {
      try { fn(...args); } catch (e) { reportAsync(e); }
    }
  }
}

export function newSessionId(cryptoObj = globalThis.crypto) {
  const b = new Uint8Array(22); // 132 bits
  if (cryptoObj && typeof cryptoObj.getRandomValues === "function") cryptoObj.getRandomValues(b);
  else for (let i = 0; i < b.length; i++) b[i] = Math.floor(Math.random() * 256);
  let s = "";
  for (const x of b) s += ID_ALPHABET[x & 63];
  return s;
}

function isObject(v) { return v !== null && typeof v === "object" && !Array.isArray(v); }

function deepFreeze(v) {
  if (v !== null && typeof v === "object" && !Object.isFrozen(v)) {
    Object.freeze(v);
    for (const k of Object.keys(v)) deepFreeze(v[k]);
  }
  return v;
}

function hasState(s) { return s !== undefined && s !== null; }

function byteLength(str) {
  if (typeof TextEncoder === "function") return new TextEncoder().encode(str).length;
  return unescape(encodeURIComponent(str)).length;
}

// ---- members and the folding rule (the same rule as node/fold_test.go) ----

const cmp = (a, b) => (a < b ? -1 : a > b ? 1 : 0); // ids are ASCII: code-unit order is byte order

function makeMember(user, sessions) {
  sessions.sort((a, b) => cmp(a.id, b.id));
  for (const s of sessions) {
    if (hasState(s.state)) deepFreeze(s.state); else delete s.state;
    Object.freeze(s);
  }
  return Object.freeze({ user, sessions: Object.freeze(sessions) });
}

// A member as the wire lists it. Without detail only sessions with a state count.
function wireMember(m, detail) {
  if (!isObject(m) || typeof m.user !== "string") return null;
  const sessions = [];
  const seen = new Set();
  for (const s of Array.isArray(m.sessions) ? m.sessions : []) {
    if (!isObject(s) || typeof s.id !== "string" || seen.has(s.id)) continue;
    if (!detail && !hasState(s.state)) continue;
    seen.add(s.id);
    sessions.push(hasState(s.state) ? { id: s.id, state: s.state } : { id: s.id });
  }
  return makeMember(m.user, sessions);
}

function stateKey(s) { return hasState(s) ? JSON.stringify(s) : ""; }

function sameMember(a, b) {
  if (a === b) return true;
  if (!a || !b || a.user !== b.user || a.sessions.length !== b.sessions.length) return false;
  for (let i = 0; i < a.sessions.length; i++) {
    const x = a.sessions[i], y = b.sessions[i];
    if (x.id !== y.id || stateKey(x.state) !== stateKey(y.state)) return false;
  }
  return true;
}

// The member after one event, by the folding rule. `undefined` = not a
// member; `null` result = the event does not apply (ignored).
function foldEvent(detail, m, ev) {
  const sid = typeof ev.session === "string" ? ev.session : undefined;
  switch (ev.kind) {
    case "online":
      return { m: makeMember(ev.user, detail && sid !== undefined ? [{ id: sid }] : []) };
    case "offline":
      return { m: undefined };
    case "update": {
      if (sid === undefined) return null;
      const sessions = m ? m.sessions.filter((s) => s.id !== sid).map((s) => ({ ...s })) : [];
      switch (ev.reason) {
        case "state":
          if (hasState(ev.state)) sessions.push({ id: sid, state: ev.state });
          else if (detail) sessions.push({ id: sid });
          break; // an unknown member is added
        case "joined":
          if (!detail) return null; // only sent with detail; nothing to show without
          sessions.push({ id: sid });
          break;
        case "left": case "expired":
          if (!m) return null;
          break;
        default:
          return null;
      }
      return { m: makeMember(ev.user, sessions) };
    }
    default:
      return null;
  }
}

// A folded room view: user -> frozen member. While a truncated snapshot is
// being paged it also logs the events it applied (per user), so a page at
// room_seq P can be corrected by the user's events above P, and keeps
// "floors": a user listed on a page at P already reflects events <= P, which
// may still arrive afterwards (events and page replies travel separately).
class Fold {
  constructor(detail) {
    this.detail = detail;
    this.members = new Map();
    this.log = null; // user -> [events applied], only while paging
    this.floors = null; // user -> page room_seq
    this.maxFloor = -Infinity;
  }
  // Applies ev; returns [before, after] when it applied, else null.
  apply(ev) {
    const u = ev.user;
    const seq = typeof ev.seq === "number" ? ev.seq : Infinity;
    if (this.floors) {
      const f = this.floors.get(u);
      const skip = f !== undefined && seq <= f;
      if (seq >= this.maxFloor) { this.floors = null; this.maxFloor = -Infinity; }
      if (skip) return null;
    }
    const before = this.members.get(u);
    const r = foldEvent(this.detail, before, ev);
    if (!r) return null;
    if (this.log) {
      let l = this.log.get(u);
      if (!l) this.log.set(u, (l = []));
      l.push({ ev, seq });
    }
    if (r.m) this.members.set(u, r.m); else this.members.delete(u);
    return [before, r.m];
  }
  // One page at room_seq `seq` covering users lo..hi (inclusive).
  applyPage(entries, seq, lo, hi) {
    const lastSeq = (u) => {
      const l = this.log && this.log.get(u);
      return l && l.length ? l[l.length - 1].seq : -Infinity;
    };
    const listed = new Set(entries.map((m) => m.user));
    const floor = (u) => {
      if (!this.floors) this.floors = new Map();
      this.floors.set(u, Math.max(seq, this.floors.get(u) ?? -Infinity));
      if (seq > this.maxFloor) this.maxFloor = seq;
    };
    // A user in the page's range but not on it was gone at `seq`.
    for (const u of [...this.members.keys()]) {
      if (u >= lo && u <= hi && !listed.has(u) && lastSeq(u) <= seq) {
        this.members.delete(u);
        floor(u);
      }
    }
    for (const entry of entries) {
      const u = entry.user;
      let m = entry;
      if (lastSeq(u) > seq) {
        // Events above the page's room_seq were applied: replay them on the page's entry.
        for (const { ev, seq: s } of this.log.get(u)) {
          if (s <= seq) continue;
          const r = foldEvent(this.detail, m, ev);
          if (r) m = r.m;
        }
      }
      if (m) this.members.set(u, m); else this.members.delete(u);
      floor(u);
    }
  }
}

// One entry of an `events` frame, [seq, kind, reason, user, session,
// sessions, state?], as the event object an `event` frame carries, so both
// go through the same code. null for an entry of the wrong shape.
function compactEvent(f, e) {
  if (!Array.isArray(e) || typeof e[0] !== "number" || typeof e[1] !== "string" || typeof e[3] !== "string") return null;
  const ev = { kind: e[1], reason: typeof e[2] === "string" ? e[2] : "", user: e[3], sessions: typeof e[5] === "number" ? e[5] : 0, seq: e[0] };
  if (typeof e[4] === "string" && e[4] !== "") ev.session = e[4]; // "" = the event names no session
  if (e.length > 6) ev.state = e[6]; // present only when a state was set
  ev.region = f.region;
  ev.room = f.room;
  ev.epoch = f.epoch;
  return ev;
}

function sessionChanges(before, after) {
  // For a view replaced by a snapshot: what changed per session.
  const changes = [];
  const a = new Map(before.sessions.map((s) => [s.id, s]));
  const b = new Map(after.sessions.map((s) => [s.id, s]));
  for (const [id, s] of b) {
    const o = a.get(id);
    if (!o) changes.push({ session: id, state: s.state, reason: hasState(s.state) ? "state" : "joined" });
    else if (stateKey(o.state) !== stateKey(s.state)) changes.push({ session: id, state: s.state, reason: "state" });
  }
  for (const id of a.keys()) if (!b.has(id)) changes.push({ session: id, state: undefined, reason: "left" });
  return changes;
}

// ---- views: a folded member list, shared by rooms and watch lists ----

// A member list kept by the folding rule, with subscribe/getSnapshot for
// useSyncExternalStore and join/leave/update/sync events that fire only
// when what members() shows changes.
class View extends Emitter {
  constructor(detail) {
    super();
    this._view = new Fold(detail);
    this._snapshot = Object.freeze([]);
    this._subs = new Set();
    // Each view takes its own stream (a room's, or a watch's: frames
    // marked watch:true), in seq order. An event at or below the
    // snapshot's seq is already in it; one at or below the last applied
    // for its user is a repeat. Both are skipped. Reset by every snapshot.
    this._floor = -Infinity;
    this._seqs = new Map(); // user -> seq of the last event applied
    this.total = 0;
    // Bound, so they can be handed over as they are (useSyncExternalStore).
    this.subscribe = this.subscribe.bind(this);
    this.getSnapshot = this.getSnapshot.bind(this);
  }

  members() { return this._snapshot; }
  getSnapshot() { return this._snapshot; }
  subscribe(fn) {
    this._subs.add(fn);
    return () => { this._subs.delete(fn); };
  }

  // False for a copy of an event already applied (see _floor).
  _fresh(ev) {
    if (typeof ev.seq !== "number") return true;
    if (ev.seq <= this._floor) return false;
    const last = this._seqs.get(ev.user);
    if (last !== undefined && ev.seq <= last) return false;
    this._seqs.set(ev.user, ev.seq);
    return true;
  }

  _resetSeqs(snapshotSeq) {
    this._floor = typeof snapshotSeq === "number" ? snapshotSeq : -Infinity;
    this._seqs = new Map();
  }

  _applyEvent(ev) {
    const r = this._view.apply(ev);
    if (!r) return;
    const [before, after] = r;
    if (sameMember(before, after)) {
      if (before) this._view.members.set(before.user, before); // keep the reference stable
      return;
    }
    this._changed();
    if (!before) this._emit("join", after, { reason: ev.reason });
    else if (!after) this._emit("leave", before, { reason: ev.reason });
    else this._emit("update", after, { session: ev.session, state: hasState(ev.state) && ev.reason === "state" ? ev.state : undefined, reason: ev.reason });
  }

  // Replaces the view; emits what changed, then `status` via _published, then "sync".
  _publish(fold) {
    const old = this._view.members;
    const now = fold.members;
    // Keep references of unchanged members (cheap re-renders), and the
    // snapshot array itself when nothing changed (getSnapshot stability).
    let changed = old.size !== now.size;
    for (const [u, m] of now) {
      const o = old.get(u);
      if (o && o !== m && sameMember(o, m)) now.set(u, o);
      else if (o !== m) changed = true;
    }
    this._view = fold;
    if (changed) this._changed();
    // In user order: leaves first, then joins and updates.
    for (const o of [...old.values()].sort((a, b) => cmp(a.user, b.user))) {
      if (!now.has(o.user)) this._emit("leave", o, { reason: "sync" });
    }
    for (const m of this._snapshot) {
      const o = old.get(m.user);
      if (!o) this._emit("join", m, { reason: "sync" });
      else if (o !== m) for (const ch of sessionChanges(o, m)) this._emit("update", m, ch);
    }
    this._published();
    this._emit("sync", this._snapshot);
  }

  _published() {}

  _changed() {
    const arr = [...this._view.members.values()].sort((a, b) => cmp(a.user, b.user));
    this._snapshot = Object.freeze(arr);
    this.total = arr.length;
    this._notify();
  }

  _notify() {
    for (const fn of [...this._subs]) {
      try { fn(); } catch (e) { reportAsync(e); }
    }
  }

  _setStatus(s) {
    if (this.status === s) return;
    this.status = s;
    this._emit("status", s);
  }
}

// ---- rooms ----

const TERMINAL = new Set(["left", "revoked", "failed", "closed"]);

class Room extends View {
  constructor(client, id, opts = {}) {
    super(opts.detail === "sessions");
    this.id = id;
    this.view = "members";
    this.detail = opts.detail === "sessions" ? "sessions" : undefined;
    // present false: following the room without a session in it (needs the observe claim).
    this.present = opts.present !== false;
    this._batch = opts.batch !== false; // this client reads `events` frames
    this.status = "joining";
    this.region = undefined; // the view's region ("global", or a region's name)
    this.error = undefined;
    this._c = client;
    this._paging = null; // {fold, gen, epoch, limit, expect, back}
    this._pageGen = 0;
    this._joinRef = undefined;
    this._synced = false; // a snapshot arrived on the current connection
    // Desired state: last setState value; gen counts setState calls.
    this._desired = null;
    this._acked = null;
    this._gen = 0;
    this._ackGen = 0;
    this._waiters = [];
  }

  get state() { return this._desired; }
  /** False while the pages of a large room are still being read. */
  get complete() { return this._paging === null && this.status === "joined"; }

  setState(state) {
    if (TERMINAL.has(this.status)) return Promise.reject(new PresenceError("not_joined", `room ${this.id} is ${this.status}`, { room: this.id }));
    // The node refuses it too: a room followed without a session has no state.
    if (!this.present) return Promise.reject(new PresenceError("not_joined", `room ${this.id} is joined with present false`, { room: this.id }));
    if (state === undefined) state = null;
    let json;
    try { json = JSON.stringify(state); } catch (e) { json = undefined; }
    if (json === undefined) return Promise.reject(new PresenceError("invalid_state", "state is not JSON", { room: this.id }));
    if (byteLength(json) > this._c.limits.max_state_bytes) {
      return Promise.reject(new PresenceError("invalid_state", `state is over ${this._c.limits.max_state_bytes} bytes`, { room: this.id }));
    }
    this._desired = deepFreeze(JSON.parse(json)); // a copy: later changes by the caller do not leak in
    const gen = ++this._gen;
    const p = new Promise((resolve, reject) => this._waiters.push({ gen, resolve, reject }));
    if (this._synced && this._c._isOpen()) this._sendState();
    return p;
  }

  leave() {
    if (TERMINAL.has(this.status)) return Promise.resolve();
    const c = this._c;
    const send = c._isOpen() && this._joinRef !== undefined;
    this._terminate("left");
    if (!send) return Promise.resolve();
    return new Promise((resolve) => {
      const attempt = () => c._request({ type: "leave", room: this.id }, (err) => {
        if (err && err.code === "unavailable" && c._isOpen()) c._later(retryDelay(c, err), attempt);
        else resolve(); // not_joined, disconnected: the session is released anyway
      });
      attempt();
    });
  }

  // -- driven by the client --

  _join() {
    this._synced = false;
    this._paging = null;
    const frame = this._joinFrame();
    const conn = this._c._conn;
    const ref = this._c._request(frame, (err) => {
      if (!err || ref !== this._joinRef || err.code === "disconnected") return;
      if (err.code === "unavailable") {
        this._c._later(retryDelay(this._c, err), () => {
          if (ref === this._joinRef && conn === this._c._conn && !TERMINAL.has(this.status)) this._join();
        });
      } else {
        this.error = err;
        this._terminate("failed", err);
        this._c._emit("error", err);
      }
    });
    this._joinRef = ref;
  }

  _joinFrame() {
    const frame = { type: "join", room: this.id };
    if (this.detail) frame.detail = this.detail;
    if (this._batch) frame.batch = true;
    if (!this.present) frame.present = false; // only when asked: it needs the observe claim
    return frame;
  }

  _disconnected() {
    this._synced = false;
    this._paging = null;
    this._joinRef = undefined;
    if (this.status === "joined") this._setStatus("rejoining");
  }

  _onSnapshot(f) {
    const s = f.snapshot;
    if (!isObject(s) || !Array.isArray(s.members)) return;
    const isJoinReply = f.ref !== undefined && f.ref === this._joinRef;
    if (!isJoinReply && !this._synced) return; // a reply to an older join: the next one follows
    this._synced = true;
    this._resetSeqs(s.room_seq);
    const fold = new Fold(!!this.detail);
    for (const w of s.members) {
      const m = wireMember(w, !!this.detail);
      if (m) fold.members.set(m.user, m);
    }
    // Floors of the old view belong to an older seq space.
    this._view.floors = null;
    const n = s.members.length;
    const offset = typeof s.offset === "number" ? s.offset : 0;
    const total = typeof s.total === "number" ? s.total : n;
    this._pageGen++;
    this.region = typeof s.region === "string" ? s.region : this.region;
    if ((f.truncated === true || total > offset + n) && n > 0) {
      fold.log = new Map();
      this._paging = { fold, gen: this._pageGen, epoch: s.epoch, limit: n, expect: s.members[n - 1].user, back: 0 };
      this._requestPage(offset + n - 1);
    } else {
      this._paging = null;
      this._publish(fold);
    }
    if (isJoinReply && this.present && (this._desired !== null || this._gen > this._ackGen)) this._sendState();
  }

  _onEvent(ev) {
    if (!this._synced || typeof ev.user !== "string") return; // before this connection's snapshot: stale
    if (!this._fresh(ev)) return;
    if (this._paging) this._paging.fold.apply(ev);
    this._applyEvent(ev);
  }

  _requestPage(offset) {
    const p = this._paging;
    const gen = p.gen;
    const c = this._c;
    c._request({ type: "members", room: this.id, offset, limit: p.limit }, (err, f) => {
      if (!this._paging || this._paging.gen !== gen) return;
      if (err) {
        if (err.code === "disconnected") return;
        if (err.code === "unavailable") return c._later(retryDelay(c, err), () => {
          if (this._paging && this._paging.gen === gen) this._requestPage(offset);
        });
        this._emit("error", err);
        return this._finishPaging(); // show what we have
      }
      this._onPage(f, offset);
    });
  }

  _onPage(f, offset) {
    const p = this._paging;
    const s = f.snapshot;
    if (!isObject(s) || !Array.isArray(s.members) || typeof s.room_seq !== "number" || s.epoch !== p.epoch) {
      // A page from another numbering: a resync snapshot is on its way and restarts paging.
      return;
    }
    const entries = [];
    for (const w of s.members) {
      const m = wireMember(w, !!this.detail);
      if (m) entries.push(m);
    }
    if (offset > 0 && (entries.length === 0 || entries[0].user > p.expect)) {
      // Users slipped across the boundary (someone before it left; the page
      // may even be empty): ask again from earlier.
      p.back = p.back ? p.back * 2 : Math.max(1, Math.floor(p.limit / 8));
      return this._requestPage(Math.max(0, offset - p.back));
    }
    p.back = 0;
    if (entries.length) p.fold.applyPage(entries, s.room_seq, entries[0].user, entries[entries.length - 1].user);
    const total = typeof s.total === "number" ? s.total : 0;
    const end = offset + s.members.length;
    if (s.members.length < p.limit || end >= total) return this._finishPaging();
    p.expect = entries[entries.length - 1].user;
    this._requestPage(end - 1); // one member of overlap
  }

  _finishPaging() {
    const fold = this._paging.fold;
    fold.log = null;
    this._paging = null;
    this._publish(fold);
  }

  _published() { this._setStatus("joined"); }

  _sendState() {
    const gen = this._gen;
    const state = this._desired;
    const c = this._c;
    c._request({ type: "state", room: this.id, state }, (err) => {
      if (err && err.code === "disconnected") return; // re-sent after the rejoin
      if (err && err.code === "unavailable") {
        return c._later(retryDelay(c, err), () => {
          if (this._gen === gen && this._synced && c._isOpen()) this._sendState();
        });
      }
      // Requests are answered in order: this settles every setState up to gen.
      this._ackGen = Math.max(this._ackGen, gen);
      if (!err) this._acked = state;
      else if (this._gen === gen) this._desired = this._acked; // refused: the server kept the old one
      this._settle(gen, err);
    });
  }

  _settle(gen, err) {
    const keep = [];
    for (const w of this._waiters) {
      if (w.gen > gen) keep.push(w);
      else if (err) w.reject(err);
      else w.resolve();
    }
    this._waiters = keep;
  }

  _terminate(status, err) {
    if (this._c._rooms.get(this.id) === this) this._c._rooms.delete(this.id);
    this._paging = null;
    this._synced = false;
    this._joinRef = undefined;
    this._settle(Infinity, err || new PresenceError("not_joined", `room ${this.id} is ${status}`, { room: this.id }));
    this._view = new Fold(!!this.detail);
    this._changed();
    this._setStatus(status);
  }
}

// A room joined with view "count": the node sends its member count, not
// its members. Joined, rejoined and left as any room; members() stays empty.
class CountRoom extends Room {
  constructor(client, id, opts = {}) {
    super(client, id, { present: opts.present });
    this.view = "count";
    this._count = null; // frozen {count} of the last count frame; null before the first
  }

  count() { return this._count ? this._count.count : undefined; }
  // Stable until the count changes (useSyncExternalStore).
  getSnapshot() { return this._count; }

  _joinFrame() {
    // No detail (refused with a count) and no batch (a count view takes no events).
    const frame = { type: "join", room: this.id, view: "count" };
    if (!this.present) frame.present = false;
    return frame;
  }

  _onSnapshot() {}
  _onEvent() {}

  _onCount(f) {
    if (typeof f.count !== "number") return;
    const isJoinReply = f.ref !== undefined && f.ref === this._joinRef;
    if (!isJoinReply && !this._synced) return; // a count from before this connection's join reply
    this._synced = true;
    if (isJoinReply && this.present && (this._desired !== null || this._gen > this._ackGen)) this._sendState();
    // Every count frame is whole: the latest is the count. It is read at a
    // tick, not at a room_seq, so there is nothing to order it by.
    const changed = !this._count || this._count.count !== f.count;
    if (changed) {
      this._count = Object.freeze({ count: f.count });
      this.total = f.count;
      this._notify();
    }
    this._setStatus("joined");
    if (changed) this._emit("count", f.count, { reason: typeof f.reason === "string" ? f.reason : "update" });
  }

  _terminate(status, err) {
    this._count = null;
    super._terminate(status, err);
  }
}

// ---- watch lists ----

const WATCH_DONE = new Set(["closed", "failed", "revoked"]);

// The list as sent: valid ids, each once, within the node's limits. Throws
// invalid_watch, the code the node would answer with, without a round trip.
function checkUsers(c, room, users) {
  const bad = (msg) => new PresenceError("invalid_watch", msg, { room });
  if (!Array.isArray(users)) throw bad("users must be an array of user ids");
  const seen = new Set();
  for (const u of users) {
    if (typeof u !== "string" || !ID_RE.test(u)) throw bad(`invalid user id ${JSON.stringify(u)}`);
    seen.add(u); // a repeated id is watched once (the node refuses repeats)
  }
  const max = c.limits.max_watch_users;
  if (seen.size > max) throw bad(`at most ${max} users per watch, not ${seen.size}`);
  const list = Object.freeze([...seen]);
  // Over max_frame_bytes the node closes the connection (1009), and the
  // reconnect would send it again: long ids can make 100 users too many.
  const bytes = byteLength(JSON.stringify({ type: "watch", room, users: list, ref: "9".repeat(20) }));
  if (bytes > c.limits.max_frame_bytes) throw bad(`the watch frame would be ${bytes} bytes, over ${c.limits.max_frame_bytes}`);
  return list;
}

// Follows some users of a room without joining it. The node holds one list
// per room and connection, so a client has one Watch per room. Watched
// members are kept as without detail (states only).
class Watch extends View {
  constructor(client, room, users) {
    super(false);
    this.room = room;
    this.status = "pending";
    this.region = undefined;
    this.error = undefined;
    this._c = client;
    this._want = users; // the list asked for last: sent again on every connect
    this._acked = null; // the list the node holds on this connection; null: none
    this._watched = new Set(); // whose events apply: the list of the last `watching` applied
    this._synced = false; // a `watching` reply arrived on this connection
    this._sent = false; // a watch frame went out on this connection
    this._gen = 0; // counts lists asked for; replies settle every promise up to theirs
    this._ackGen = 0;
    this._waiters = [];
    this.ready = this._set(users);
  }

  get users() { return this._want; }

  /** Replaces the list; resolves once the node answered with the new one. */
  update(users) {
    if (WATCH_DONE.has(this.status)) return Promise.reject(new PresenceError("closed", `the watch of ${this.room} is ${this.status}`, { room: this.room }));
    let list;
    try { list = checkUsers(this._c, this.room, users); } catch (e) { return Promise.reject(e); }
    return (this.ready = this._set(list));
  }

  /** Ends the watch (users: []); the view empties at once. */
  close() {
    if (WATCH_DONE.has(this.status)) return Promise.resolve();
    const c = this._c;
    const send = c._isOpen() && this._sent;
    this._terminate("closed", new PresenceError("closed", `the watch of ${this.room} was closed`, { room: this.room }));
    if (!send) return Promise.resolve();
    return new Promise((resolve) => {
      const attempt = () => c._request({ type: "watch", room: this.room, users: [] }, (err) => {
        if (err && err.code === "unavailable" && c._isOpen()) c._later(retryDelay(c, err), attempt);
        else resolve(); // disconnected: the node forgets the watch with the connection
      });
      attempt();
    });
  }

  // -- driven by the client --

  _set(list) {
    this._want = list;
    const gen = ++this._gen;
    const p = new Promise((resolve, reject) => this._waiters.push({ gen, resolve, reject }));
    p.catch(() => {}); // `ready` may go unread: a refusal is also an `error` event
    if (this._c._isOpen()) this._push();
    return p;
  }

  // Sends the list, at hello and when it changes while open.
  _push() {
    if (this._want.length > 0 || this._sent) return this._send();
    // An empty list and nothing sent on this connection: the node holds no
    // watch for us, which is what was asked. Nothing to send.
    this._ackGen = this._gen;
    this._settle(this._gen, null);
    this._onWatching({}, this._want);
  }

  _send() {
    const c = this._c;
    const gen = this._gen;
    const users = this._want;
    const conn = c._conn;
    this._sent = true;
    c._request({ type: "watch", room: this.room, users: [...users] }, (err, f) => {
      if (WATCH_DONE.has(this.status)) return;
      if (err) {
        if (err.code === "disconnected") return; // sent again after the next hello
        if (err.code === "unavailable") {
          // The node dropped the room's watch: nothing comes until it is sent again.
          this._acked = null;
          this._synced = false;
          if (this.status === "active") this._setStatus("rewatching");
          return c._later(retryDelay(c, err), () => {
            if (this._gen === gen && conn === c._conn && c._isOpen() && !WATCH_DONE.has(this.status)) this._send();
          });
        }
        // Refused: nothing changed at the node. Requests are answered in
        // order, so this settles every list asked for up to gen.
        this._ackGen = Math.max(this._ackGen, gen);
        if (this._gen === gen) {
          if (this._acked === null) return this._fail(err); // the node holds no list for us
          this._want = this._acked; // it kept the old one
        }
        this._settle(gen, err);
        this._emit("error", err);
        return;
      }
      this._ackGen = Math.max(this._ackGen, gen);
      this._acked = users;
      this._onWatching(f, users);
      this._settle(gen, null);
    });
  }

  // A `watching` for `users`: replaces the view, as a snapshot does a room's.
  _onWatching(f, users) {
    this._synced = true;
    this._watched = new Set(users);
    const s = f.snapshot;
    const fold = new Fold(false);
    this._resetSeqs(isObject(s) ? s.room_seq : undefined);
    if (isObject(s)) {
      if (typeof s.region === "string") this.region = s.region;
      for (const w of Array.isArray(s.members) ? s.members : []) {
        const m = wireMember(w, false);
        if (m && this._watched.has(m.user)) fold.members.set(m.user, m);
      }
    }
    this._publish(fold);
  }

  // Unasked `watching`: reason resync (the node lost track) replaces the
  // view; reason revoked (a refresh took the room away) ends the watch.
  _onUnasked(f) {
    if (f.reason === "revoked") {
      return this._terminate("revoked", new PresenceError("revoked", `access to room ${this.room} was revoked`, { room: this.room }));
    }
    if (!this._synced) return; // before this connection's reply: the reply follows
    this._onWatching(f, [...this._watched]);
  }

  _onEvent(ev) {
    // Only the watched users: a joined room of the same id brings everyone's.
    if (!this._synced || typeof ev.user !== "string" || !this._watched.has(ev.user)) return;
    if (!this._fresh(ev)) return;
    this._applyEvent(ev);
  }

  _published() { this._setStatus("active"); }

  _disconnected() {
    this._synced = false;
    this._sent = false;
    this._acked = null;
    if (this.status === "active") this._setStatus("rewatching");
  }

  _fail(err) {
    this.error = err;
    this._terminate("failed", err);
    this._emit("error", err);
    this._c._emit("error", err);
  }

  _settle(gen, err) {
    const keep = [];
    for (const w of this._waiters) {
      if (w.gen > gen) keep.push(w);
      else if (err) w.reject(err);
      else w.resolve();
    }
    this._waiters = keep;
  }

  _terminate(status, err) {
    if (this._c._watches.get(this.room) === this) this._c._watches.delete(this.room);
    this._synced = false;
    this._settle(Infinity, err || new PresenceError("closed", `the watch of ${this.room} is ${status}`, { room: this.room }));
    this._view = new Fold(false);
    this._changed();
    this._setStatus(status);
  }
}

function retryDelay(c, err) {
  const base = typeof err.retryAfterMs === "number" && err.retryAfterMs > 0 ? err.retryAfterMs : 1000;
  return base * (0.75 + 0.5 * c._random()); // jittered: clients refused together do not return together
}

function errorFromFrame(f) {
  const extra = {};
  if (typeof f.retry_after_ms === "number") extra.retryAfterMs = f.retry_after_ms;
  if (typeof f.ref === "string") extra.ref = f.ref;
  if (typeof f.room === "string") extra.room = f.room;
  return new PresenceError(typeof f.code === "string" ? f.code : "unknown", typeof f.message === "string" ? f.message : undefined, extra);
}

// ---- duplicated tabs ----

// One BroadcastChannel per constructor per realm: clients in the same tab
// never hear each other (they share the tab's session on purpose).
const channels = new WeakMap();

function joinChannel(BC, client) {
  let ch = channels.get(BC);
  if (!ch) {
    let bc;
    try { bc = new BC(CHANNEL_NAME); } catch (e) { return null; }
    ch = { bc, clients: new Set() };
    bc.onmessage = (e) => {
      for (const c of [...ch.clients]) c._onTabMessage(e && e.data);
    };
    channels.set(BC, ch);
  }
  ch.clients.add(client);
  return ch;
}

function leaveChannel(BC, client) {
  const ch = channels.get(BC);
  if (!ch) return;
  ch.clients.delete(client);
  if (ch.clients.size === 0) {
    channels.delete(BC);
    try { ch.bc.close(); } catch (e) { /* closed already */ }
  }
}

// ---- the client ----

function toWsUrl(url, base) {
  const u = new URL(url, base);
  if (u.protocol === "http:") u.protocol = "ws:";
  else if (u.protocol === "https:") u.protocol = "wss:";
  if (u.protocol !== "ws:" && u.protocol !== "wss:") throw new TypeError(`presence: not a WebSocket URL: ${url}`);
  return u;
}

// reconnectDelay is the wait before the next connect attempt, and counts
// the attempt. down: ms since the last open connection dropped, or null
// (never open yet). Inside the offline grace, up to GRACE_MARGIN_MS before
// its end, the first retry waits random() * 500 ms and the others half to
// all of min(1 s, 500 ms * 2^attempt): jittered, never more than 1 s
// apart. Past that (or before the first hello) it is full jitter,
// random() * min(10 s, base * 2^n): base 1 s and n counted from the
// grace's end after a drop, base 500 ms and n the attempts before a hello.
function reconnectDelay(c, down) {
  const n = c._attempt;
  if (c._attempt < 30) c._attempt++;
  if (down !== null && down < c.offlineGraceMs - GRACE_MARGIN_MS) {
    const cap = Math.min(GRACE_RETRY_MS, BACKOFF_BASE_MS * 2 ** n);
    const d = n === 0 ? c._random() * cap : cap * (0.5 + 0.5 * c._random());
    // The last try inside the grace lands before its end.
    return Math.min(d, Math.max(0, c.offlineGraceMs - GRACE_MARGIN_MS - down) + GRACE_MARGIN_MS / 2);
  }
  if (down === null) return c._random() * Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** n);
  const k = c._lateAttempt;
  if (c._lateAttempt < 30) c._lateAttempt++;
  return c._random() * Math.min(BACKOFF_CAP_MS, GRACE_RETRY_MS * 2 ** k);
}

class Client extends Emitter {
  constructor(opts) {
    super();
    const g = globalThis;
    this._url = toWsUrl(opts.url, g.location && g.location.href);
    this._getTokenFn = opts.getToken;
    this._user = opts.user;
    this._WS = opts.WebSocket || g.WebSocket;
    if (typeof this._WS !== "function") throw new TypeError("presence: no WebSocket: pass the WebSocket option");
    this._setTimeout = opts.setTimeout || ((f, ms) => g.setTimeout(f, ms));
    this._clearTimeout = opts.clearTimeout || ((t) => g.clearTimeout(t));
    this._now = opts.now || (() => Date.now());
    this._random = opts.random || Math.random;
    this._crypto = opts.crypto || g.crypto;
    this._BC = opts.BroadcastChannel !== undefined ? opts.BroadcastChannel : g.BroadcastChannel;
    this._window = opts.window !== undefined ? opts.window : g.window;
    this._pingIntervalMs = opts.pingIntervalMs ?? 15000;
    this._pingTimeoutMs = opts.pingTimeoutMs ?? 10000;
    this._helloTimeoutMs = opts.helloTimeoutMs ?? 15000;
    this._stableMs = opts.stableMs ?? 5000;
    this._dupCheckMs = opts.duplicateCheckMs ?? 120;

    this.status = "connecting";
    this.user = undefined;
    this.region = undefined;
    this.limits = DEFAULT_LIMITS;
    this.tokenExpires = undefined;

    this._rooms = new Map();
    this._watches = new Map(); // room id -> Watch
    this._closed = false;
    this._everOpen = false;
    this._conn = 0; // counts connection attempts; stale callbacks compare it
    this._ws = null;
    this._helloed = false;
    this._attempt = 0;
    this._lateAttempt = 0; // attempts since the grace of the last drop ran out
    this._downSince = null; // when the last open connection dropped
    this.offlineGraceMs = GRACE_DEFAULT_MS; // from hello; paces reconnects
    this._freshToken = false;
    this._earlyCloses = 0; // connects in a row that closed before hello (not 4401)
    this._refusals = 0; // 4401 closes in a row
    this._sentToken = false; // the last connect offered a token
    this._reported = new Set(); // codes of connect errors reported since the last hello
    this._refSeq = 0;
    this._pending = new Map(); // ref -> callback(err, frame)
    this._queue = []; // {data, onSent, ref}
    this._tokens = 0;
    this._tokensAt = 0;
    this._timers = new Set();
    this._retryTimer = null;
    this._pumpTimer = null;
    this._pingTimer = null;
    this._deadTimer = null;
    this._refreshTimer = null;
    this._running = false; // answers duplicate-tab announcements
    this._checking = null;

    // Session id: explicit, else per tab in sessionStorage.
    this._idFromStorage = false;
    if (opts.sessionId !== undefined) {
      if (!ID_RE.test(opts.sessionId)) throw new TypeError("presence: invalid sessionId");
      this.sessionId = opts.sessionId;
      this._BC = undefined; // the caller owns the id
    } else {
      this._storage = opts.storage !== undefined ? opts.storage : safeSessionStorage();
      const stored = readStorage(this._storage);
      if (stored && ID_RE.test(stored)) {
        this.sessionId = stored;
        this._idFromStorage = true;
      } else {
        this.sessionId = newSessionId(this._crypto);
        writeStorage(this._storage, this.sessionId);
      }
    }

    this._onOnline = () => {
      // The network is back: skip the rest of the backoff.
      if (this._retryTimer !== null) {
        this._clear(this._retryTimer);
        this._retryTimer = null;
        this._connect();
      }
    };
    if (this._window && typeof this._window.addEventListener === "function") {
      this._window.addEventListener("online", this._onOnline);
    }
    this._start();
  }

  async _start() {
    if (typeof this._BC === "function") {
      this._channel = joinChannel(this._BC, this);
      if (this._channel && this._idFromStorage && (await this._isDuplicate())) {
        // A duplicated tab copied our sessionStorage: take an id of our own.
        this.sessionId = newSessionId(this._crypto);
        writeStorage(this._storage, this.sessionId);
      }
    }
    if (this._closed) return;
    this._running = true;
    this._connect();
  }

  _isDuplicate() {
    const nonce = newSessionId(this._crypto);
    return new Promise((resolve) => {
      const t = this._later(this._dupCheckMs, () => { this._checking = null; resolve(false); });
      this._checking = { id: this.sessionId, nonce, answer: () => { this._clear(t); this._checking = null; resolve(true); } };
      this._post({ type: MSG_TYPE, op: "announce", id: this.sessionId, nonce });
    });
  }

  _onTabMessage(d) {
    if (!isObject(d) || d.type !== MSG_TYPE || typeof d.id !== "string") return;
    if (d.op === "announce" && d.id === this.sessionId) {
      if (this._running) {
        this._post({ type: MSG_TYPE, op: "in_use", id: d.id, to: d.nonce });
      } else if (this._checking && typeof d.nonce === "string") {
        // Two tabs checking the same id at once (maybe only one hears the
        // other): the larger nonce keeps it, whichever tab decides.
        if (d.nonce < this._checking.nonce) this._post({ type: MSG_TYPE, op: "in_use", id: d.id, to: d.nonce });
        else this._checking.answer();
      }
    } else if (d.op === "in_use" && this._checking && d.id === this._checking.id && d.to === this._checking.nonce) {
      this._checking.answer();
    }
  }

  _post(msg) {
    try { this._channel.bc.postMessage(msg); } catch (e) { /* channel closed */ }
  }

  // -- public --

  room(id, opts) {
    if (typeof id !== "string" || id === "") throw new TypeError("presence: room id must be a non-empty string");
    let r = this._rooms.get(id);
    if (r) {
      // The first call's options win, but a count room is another kind of object.
      const want = opts && opts.view === "count" ? "count" : "members";
      if (r.view !== want) throw new PresenceError("invalid_view", `room ${id} is open with view ${r.view}: leave it first`, { room: id });
      return r;
    }
    if (this._closed) throw new PresenceError("closed", "the client is closed");
    opts = opts || {};
    const view = opts.view === undefined ? "members" : opts.view;
    if (view !== "members" && view !== "count") throw new PresenceError("invalid_view", `view must be "members" or "count", not ${JSON.stringify(view)}`, { room: id });
    if (view === "count" && opts.detail !== undefined) throw new PresenceError("invalid_view", "detail does not go with view count", { room: id });
    r = view === "count" ? new CountRoom(this, id, opts) : new Room(this, id, opts);
    this._rooms.set(id, r);
    if (this._isOpen()) r._join();
    return r;
  }

  rooms() { return [...this._rooms.values()]; }

  /**
   * Follows `users` of room `roomId` (no join needed). One watch per room:
   * the same room gives the same object, with its list replaced.
   */
  watch(roomId, users) {
    if (typeof roomId !== "string" || roomId === "") throw new TypeError("presence: room id must be a non-empty string");
    if (this._closed) throw new PresenceError("closed", "the client is closed");
    const list = checkUsers(this, roomId, users);
    const w = this._watches.get(roomId);
    if (w) {
      const same = w._want.length === list.length && w._want.every((u, i) => u === list[i]);
      if (!same) w.update(list);
      return w;
    }
    const nw = new Watch(this, roomId, list);
    this._watches.set(roomId, nw);
    return nw;
  }

  watches() { return [...this._watches.values()]; }

  /** Resolves with the round trip in ms. */
  ping() {
    if (!this._isOpen()) return Promise.reject(new PresenceError("disconnected", "not connected"));
    const t0 = this._now();
    return new Promise((resolve, reject) => {
      this._request({ type: "ping" }, (err) => (err ? reject(err) : resolve(this._now() - t0)));
    });
  }

  close() {
    if (this._closed) return;
    this._closed = true;
    this._running = false;
    const ws = this._ws;
    this._drop();
    if (ws) closeQuietly(ws, 1000, "client closed");
    this._stop();
  }

  // -- connection --

  _isOpen() { return this._ws !== null && this._helloed; }

  _setStatus(s) {
    if (this.status === s) return;
    this.status = s;
    this._emit("status", s);
  }

  async _getToken(fresh) {
    if (typeof this._getTokenFn !== "function") return undefined;
    return this._getTokenFn({ fresh });
  }

  async _connect() {
    if (this._closed) return;
    const conn = ++this._conn;
    this._setStatus(this._everOpen ? "reconnecting" : "connecting");
    let token;
    try {
      token = await this._getToken(this._freshToken);
    } catch (e) {
      if (conn !== this._conn || this._closed) return;
      this._reportOnce(new PresenceError("token_error", "getToken failed: " + (e && e.message), { cause: e, hint: "check the token endpoint (its status and what it returns)" }));
      this._freshToken = true;
      return this._reconnectIn(this._backoff());
    }
    if (conn !== this._conn || this._closed) return;
    const checked = tokenOf(token);
    if (checked.err) {
      // Never offered as a subprotocol ("bearer.<!DOCTYPE…" throws) or sent.
      this._reportOnce(checked.err);
      this._freshToken = true;
      return this._reconnectIn(this._backoff());
    }
    token = checked.token;
    this._freshToken = false;
    this._sentToken = token !== undefined;
    const url = new URL(this._url.href);
    url.searchParams.set("session", this.sessionId);
    if (this._user !== undefined) url.searchParams.set("user", this._user);
    const protocols = token ? [PROTOCOL, "bearer." + token] : [PROTOCOL];
    let ws;
    try {
      ws = new this._WS(url.href, protocols);
    } catch (e) {
      this._reportOnce(new PresenceError("connect_failed", "new WebSocket failed: " + String(e && e.message), { cause: e }));
      return this._reconnectIn(this._backoff());
    }
    this._ws = ws;
    this._helloed = false;
    ws.onmessage = (e) => this._onMessage(ws, e);
    ws.onclose = (e) => this._onClose(ws, e && typeof e.code === "number" ? e.code : 1006, e && e.reason);
    ws.onerror = () => {}; // a close follows
    this._helloTimer = this._later(this._helloTimeoutMs, () => {
      if (this._ws === ws && !this._helloed) this._abandon(ws);
    });
  }

  _onMessage(ws, e) {
    if (ws !== this._ws) return;
    let f;
    try { f = JSON.parse(e.data); } catch (err) { return; }
    if (!isObject(f) || typeof f.type !== "string") return;
    try {
      this._onFrame(f);
    } catch (err) {
      // Never let a frame break the connection's handler; surface the bug.
      this._emit("error", new PresenceError("internal", "client error handling a frame: " + (err && err.message), { cause: err }));
    }
  }

  _onFrame(f) {
    // Any frame shows the connection is alive.
    if (this._deadTimer !== null) { this._clear(this._deadTimer); this._deadTimer = null; }
    if (f.type === "hello") return this._onHello(f);
    if (!this._helloed) return;
    const roomId = typeof f.room === "string" ? f.room : undefined;
    const room = roomId !== undefined ? this._rooms.get(roomId) : undefined;
    switch (f.type) {
      case "snapshot":
        if (room) room._onSnapshot(f);
        break;
      case "count":
        if (room && room.view === "count") room._onCount(f);
        break;
      case "watching":
        // Replies are handled by their request; unasked is a resync.
        if (f.ref === undefined && roomId !== undefined) {
          const w = this._watches.get(roomId);
          if (w) w._onUnasked(f);
        }
        break;
      case "event":
        // A watch list's events are marked watch:true; the room's are not.
        if (isObject(f.event) && typeof f.event.room === "string") this._deliver(f.event, f.watch === true);
        break;
      case "events":
        // A tick's events of one room, in seq order: applied one by one,
        // exactly as if each had come in its own `event` frame.
        if (roomId !== undefined && Array.isArray(f.events)) {
          for (const e of f.events) {
            const ev = compactEvent(f, e);
            if (ev) this._deliver(ev, false);
          }
        }
        break;
      case "left":
        if (f.ref === undefined && f.reason === "revoked" && room) {
          room._terminate("revoked", new PresenceError("revoked", `access to room ${room.id} was revoked`, { room: room.id }));
        }
        break;
      case "error":
        if (typeof f.ref !== "string" || !this._pending.has(f.ref)) this._emit("error", errorFromFrame(f));
        break;
    }
    if (typeof f.ref === "string") {
      const cb = this._pending.get(f.ref);
      if (cb) {
        this._pending.delete(f.ref);
        if (f.type === "error") cb(errorFromFrame(f));
        else cb(null, f);
      }
    }
  }

  // An event goes to the stream it came by: a watch list's (marked
  // watch:true) or the room's. A connection that joined a room and
  // watches it gets the watched users' events on both, each in order.
  _deliver(ev, watch) {
    const v = watch ? this._watches.get(ev.room) : this._rooms.get(ev.room);
    if (v) v._onEvent(ev);
  }

  _onHello(f) {
    if (this._helloed) return;
    if (f.v !== 1) {
      this._emit("error", new PresenceError("unsupported_version", `server speaks protocol version ${f.v}`));
      const ws = this._ws;
      this._drop();
      closeQuietly(ws, 1000, "unsupported version");
      return this._stop();
    }
    this._clear(this._helloTimer);
    this._helloed = true;
    this._everOpen = true;
    this._downSince = null;
    this._earlyCloses = this._refusals = 0;
    this._reported.clear();
    if (typeof f.offline_grace_ms === "number" && f.offline_grace_ms > 0) this.offlineGraceMs = f.offline_grace_ms;
    const lim = isObject(f.limits) ? f.limits : {};
    const limits = { ...DEFAULT_LIMITS };
    for (const k of Object.keys(DEFAULT_LIMITS)) if (typeof lim[k] === "number" && lim[k] > 0) limits[k] = lim[k];
    this.limits = Object.freeze(limits);
    // Our bucket is a little smaller and slower than the server's: frames
    // sent evenly can still arrive bunched.
    this._rate = limits.frame_rate * 0.9;
    this._burst = Math.max(1, limits.frame_burst - 2);
    this._tokens = this._burst;
    this._tokensAt = this._now();
    if (typeof f.user === "string") this.user = f.user;
    if (typeof f.region === "string") this.region = f.region;
    const conn = this._conn;
    // Backoff resets once a connection has stayed up a while: a node that
    // accepts and drops at once must not be hammered.
    this._later(this._stableMs, () => { if (conn === this._conn && this._isOpen()) this._attempt = this._lateAttempt = 0; });
    this._scheduleRefresh(f.token_expires);
    this._scheduleKeepalive();
    this._setStatus("open");
    for (const r of [...this._rooms.values()]) r._join();
    for (const w of [...this._watches.values()]) w._push();
  }

  _onClose(ws, code, reason) {
    if (ws !== this._ws) return;
    const helloed = this._helloed;
    this._drop();
    if (this._closed) return;
    if (helloed && this._downSince === null) this._downSince = this._now();
    if (this._serverDisconnect(code, reason)) return;
    if (code === 4001) {
      // Another connection took this session over: do not fight it.
      this._emit("error", new PresenceError("session_taken", "the session was taken by a newer connection (close 4001)"));
      this._closed = true;
      return this._stop();
    }
    if (!helloed && this._earlyClose(code, reason)) return;
    if (!helloed) this._freshToken = true; // a 401 looks like 1006 before open
    let delay;
    if (code === 4002) {
      this._freshToken = true;
      delay = 0;
    } else if ((code === 1012 || code === 1001) && helloed) {
      delay = this._random() * QUICK_RETRY_MS;
    } else if (code === 1008) {
      delay = POLICY_BACKOFF_MS + this._backoff();
    } else {
      delay = this._backoff();
    }
    this._reconnectIn(delay);
  }

  // Closes by the server API (docs/PROTOCOL.md, close codes): 4004, revoked
  // until a time, is final; 4003 reconnects, with a fresh token, after the
  // usual backoff. Returns true when the client stopped.
  _serverDisconnect(code, reason) {
    if (code === 4003) this._freshToken = true;
    if (code !== 4004) return false;
    const m = /^revoked until (\S+)$/.exec(typeof reason === "string" ? reason : "");
    const until = m ? new Date(m[1]) : null;
    const extra = until && !isNaN(until) ? { revokedUntil: until } : {};
    this._emit("error", new PresenceError("revoked", "the server revoked this user" + (m ? " until " + m[1] : "") + " (close 4004)", extra));
    this._closed = true;
    this._stop();
    return true;
  }

  // A connect that closed before hello: counted, and a run of them
  // reported once (see CLOSE_UNAUTHORIZED). Returns true when the client
  // stopped: refused without a getToken, nothing it could send would do.
  _earlyClose(code, reason) {
    const why = typeof reason === "string" && reason !== "" ? reason : undefined;
    if (code === CLOSE_UNAUTHORIZED) {
      this._refusals++;
      const extra = { closeCode: code, closeReason: why };
      const msg = "the node refused the connection: " + (why || "unauthorized") + " (close 4401)";
      if (typeof this._getTokenFn !== "function") {
        extra.hint = this._user === undefined
          ? "no getToken and no user: a dev node needs the user option (or getToken with a token from /dev/token), any other node getToken"
          : "the node takes no ?user= for this user (not a dev node, or not a valid user id): pass getToken";
        this._reportOnce(new PresenceError("unauthorized", msg, extra));
        this._closed = true;
        this._stop();
        return true;
      }
      // The first may be a stale token: a fresh one is asked for next.
      if (this._refusals >= 2) {
        extra.hint = this._sentToken
          ? "a fresh token was refused too: check what the token endpoint mints (signing key, iss, aud, sub, rooms) against the node's settings"
          : "getToken returned no token, and this node needs one (only a dev node takes the user option instead)";
        this._reportOnce(new PresenceError("unauthorized", msg, extra));
      }
      return false;
    }
    this._earlyCloses++;
    const inGrace = this._downSince !== null && this._now() - this._downSince < this.offlineGraceMs;
    if (this._earlyCloses >= EARLY_CLOSES && !inGrace) {
      this._reportOnce(new PresenceError("connect_refused",
        `${this._earlyCloses} connections in a row closed before the node's hello (close ${code}${why ? " " + why : ""}): refused, or no node there`,
        { closeCode: code, closeReason: why, hint: "a browser cannot read why a handshake was refused: check the URL, the token endpoint, that a dev node gets the user option, and the node's log" }));
    }
    return false;
  }

  // An error nobody listens to is logged, never dropped: a page that
  // forgot client.on("error") still shows why it cannot connect.
  _emit(type, ...args) {
    const set = this._listeners.get(type);
    if (type === "error" && (!set || set.size === 0)) {
      const e = args[0];
      if (typeof console !== "undefined") console.error("presence: " + (e && e.code) + ": " + (e && e.message) + (e && e.hint ? " (" + e.hint + ")" : ""));
      return;
    }
    super._emit(type, ...args);
  }

  // Emits err unless an error of its code was already reported since the
  // last hello: a run of failed connects surfaces once per code.
  _reportOnce(err) {
    if (this._reported.has(err.code)) return;
    this._reported.add(err.code);
    this._emit("error", err);
  }

  _backoff() {
    return reconnectDelay(this, this._downSince === null ? null : this._now() - this._downSince);
  }

  _reconnectIn(delay) {
    this._setStatus(this._everOpen ? "reconnecting" : "connecting");
    this._retryTimer = this._later(delay, () => {
      this._retryTimer = null;
      this._connect();
    });
  }

  // The socket seems dead: forget it at once (its close may take long) and reconnect.
  _abandon(ws) {
    this._onClose(ws, 1006);
    closeQuietly(ws, 1000, "no answer");
  }

  // Forgets the current connection: timers, queue, pending requests.
  _drop() {
    const ws = this._ws;
    this._ws = null;
    this._helloed = false;
    if (ws) { ws.onmessage = null; ws.onclose = null; ws.onerror = null; }
    for (const t of [this._helloTimer, this._pumpTimer, this._pingTimer, this._deadTimer, this._refreshTimer]) this._clear(t);
    this._pumpTimer = this._pingTimer = this._deadTimer = this._refreshTimer = null;
    const pending = [...this._pending.values()];
    this._pending.clear();
    this._queue = [];
    const err = new PresenceError("disconnected", "the connection closed");
    for (const cb of pending) cb(err);
    for (const r of [...this._rooms.values()]) r._disconnected();
    for (const w of [...this._watches.values()]) w._disconnected();
  }

  _stop() {
    for (const t of this._timers) this._clearTimeout(t);
    this._timers.clear();
    this._retryTimer = null;
    if (this._window && typeof this._window.removeEventListener === "function") {
      this._window.removeEventListener("online", this._onOnline);
    }
    if (this._channel) leaveChannel(this._BC, this);
    this._running = false;
    for (const r of [...this._rooms.values()]) r._terminate("left", new PresenceError("closed", "the client is closed", { room: r.id }));
    for (const w of [...this._watches.values()]) w._terminate("closed");
    this._setStatus("closed");
  }

  // -- frames out: requests and pacing --

  // Sends a request; cb(err, reply) runs once: with the reply, an Error
  // for the error frame, or code "disconnected". Returns the ref.
  _request(frame, cb) {
    const ref = String(++this._refSeq);
    frame.ref = ref;
    if (!this._isOpen()) {
      // Frames never outlive their connection; callers resend after the next hello.
      queueMicrotask(() => cb(new PresenceError("disconnected", "not connected")));
      return ref;
    }
    this._pending.set(ref, cb);
    this._enqueue(JSON.stringify(frame), null);
    return ref;
  }

  _enqueue(data, onSent) {
    this._queue.push({ data, onSent });
    this._pump();
  }

  // Token bucket: a frame goes out only with a whole token, so the server's
  // limiter (frame_rate/s, burst frame_burst) never drops one.
  _pump() {
    if (!this._isOpen() || this._pumpTimer !== null) return;
    const now = this._now();
    this._tokens = Math.min(this._burst, this._tokens + ((now - this._tokensAt) * this._rate) / 1000);
    this._tokensAt = now;
    while (this._queue.length && this._tokens >= 1) {
      this._tokens -= 1;
      const { data, onSent } = this._queue.shift();
      try { this._ws.send(data); } catch (e) { /* the close event follows */ }
      if (onSent) onSent();
      if (!this._isOpen()) return;
    }
    if (this._queue.length) {
      const wait = Math.ceil(((1 - this._tokens) * 1000) / this._rate);
      this._pumpTimer = this._later(wait, () => { this._pumpTimer = null; this._pump(); });
    }
  }

  _scheduleKeepalive() {
    this._pingTimer = this._later(this._pingIntervalMs, () => {
      this._pingTimer = null;
      if (!this._isOpen()) return;
      const ws = this._ws;
      const ref = String(++this._refSeq);
      this._pending.set(ref, () => {});
      // The timeout runs from when the ping actually leaves (pacing may hold it).
      this._enqueue(JSON.stringify({ type: "ping", ref }), () => {
        if (this._deadTimer === null) this._deadTimer = this._later(this._pingTimeoutMs, () => {
          this._deadTimer = null;
          if (this._ws === ws) this._abandon(ws);
        });
      });
      this._scheduleKeepalive();
    });
  }

  // -- token refresh --

  _scheduleRefresh(expires) {
    this._clear(this._refreshTimer);
    this._refreshTimer = null;
    const exp = typeof expires === "string" ? Date.parse(expires) : NaN;
    if (Number.isNaN(exp)) return;
    this.tokenExpires = new Date(exp);
    if (typeof this._getTokenFn !== "function") return;
    const remaining = exp - this._now();
    const lead = Math.min(60000, remaining / 10);
    this._refreshTimer = this._later(Math.max(0, remaining - lead), () => this._refresh());
  }

  _retryRefresh() {
    if (!this._isOpen() || !this.tokenExpires) return;
    const remaining = this.tokenExpires.getTime() - this._now();
    this._clear(this._refreshTimer);
    this._refreshTimer = this._later(Math.max(1000, Math.min(5000, remaining / 2)), () => this._refresh());
  }

  async _refresh() {
    this._refreshTimer = null;
    const conn = this._conn;
    let token;
    try {
      token = await this._getToken(true);
    } catch (e) {
      if (conn !== this._conn || !this._isOpen()) return;
      this._emit("error", new PresenceError("token_error", "getToken failed: " + (e && e.message), { cause: e }));
      return this._retryRefresh();
    }
    if (conn !== this._conn || !this._isOpen()) return;
    const checked = tokenOf(token);
    if (checked.err) {
      this._emit("error", checked.err);
      return this._retryRefresh();
    }
    token = checked.token;
    if (!token) return this._retryRefresh();
    this._request({ type: "refresh", token }, (err, f) => {
      if (err) {
        if (err.code === "disconnected") return;
        this._emit("error", err);
        return this._retryRefresh();
      }
      this._scheduleRefresh(f.token_expires);
    });
  }

  // -- timers --

  _later(ms, fn) {
    const t = this._setTimeout(() => { this._timers.delete(t); fn(); }, ms);
    this._timers.add(t);
    return t;
  }

  _clear(t) {
    if (t === null || t === undefined) return;
    this._timers.delete(t);
    this._clearTimeout(t);
  }
}

function closeQuietly(ws, code, reason) {
  try { ws.close(code, reason); } catch (e) { /* already closed */ }
}

function safeSessionStorage() {
  try { return globalThis.sessionStorage; } catch (e) { return undefined; } // blocked storage throws
}
function readStorage(s) {
  try { return s ? s.getItem(STORAGE_KEY) : null; } catch (e) { return null; }
}
function writeStorage(s, v) {
  try { if (s) s.setItem(STORAGE_KEY, v); } catch (e) { /* full or blocked: the id lives in memory */ }
}

/** Creates a client and starts connecting. */
export function createClient(opts) {
  if (!opts || typeof opts.url !== "string") throw new TypeError("presence: createClient needs a url");
  return new Client(opts);
}
