// The folding rule: snapshot + events == a fresh snapshot.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setup, open, answerJoin, eventFrame, eventsFrame, snapshotFrame, plain, flush } from "./helpers.js";

async function joined(detail, members, opts) {
  const h = setup();
  const s = await open(h);
  const room = h.client.room("r", detail ? { detail: "sessions" } : undefined);
  const seen = [];
  for (const t of ["join", "leave", "update", "sync"]) room.on(t, (m, c) => seen.push([t, t === "sync" ? m.length : m.user, c]));
  answerJoin(s, "r", members, opts);
  return { h, s, room, seen };
}

test("detail sessions: snapshot then events fold to the spec's view", async () => {
  const { s, room } = await joined(true, [
    { user: "a", until: "x", sessions: [{ id: "t1", expires: "x" }, { id: "t2", expires: "x", state: { status: "away" } }] },
  ], { seq: 10 });
  assert.equal(room.status, "joined");
  assert.deepEqual(plain(room.members()), [{ user: "a", sessions: [{ id: "t1" }, { id: "t2", state: { status: "away" } }] }]);
  s.recv(eventFrame("r", 11, { kind: "online", reason: "joined", user: "b", session: "p1", sessions: 1 }));
  s.recv(eventFrame("r", 12, { kind: "update", reason: "joined", user: "a", session: "t3", sessions: 3 }));
  s.recv(eventFrame("r", 13, { kind: "update", reason: "state", user: "a", session: "t1", state: "typing", sessions: 3 }));
  s.recv(eventFrame("r", 14, { kind: "update", reason: "state", user: "a", session: "t2", sessions: 3 })); // cleared
  s.recv(eventFrame("r", 15, { kind: "update", reason: "left", user: "a", session: "t3", sessions: 2 }));
  s.recv(eventFrame("r", 16, { kind: "update", reason: "state", user: "c", session: "z", state: 1, sessions: 1 })); // unknown member: added
  assert.deepEqual(plain(room.members()), [
    { user: "a", sessions: [{ id: "t1", state: "typing" }, { id: "t2" }] },
    { user: "b", sessions: [{ id: "p1" }] },
    { user: "c", sessions: [{ id: "z", state: 1 }] },
  ]);
  s.recv(eventFrame("r", 17, { kind: "update", reason: "expired", user: "a", session: "t1", sessions: 1 }));
  s.recv(eventFrame("r", 18, { kind: "offline", reason: "left", user: "b", sessions: 0 }));
  assert.deepEqual(plain(room.members()), [
    { user: "a", sessions: [{ id: "t2" }] },
    { user: "c", sessions: [{ id: "z", state: 1 }] },
  ]);
});

test("without detail: only sessions with a state are listed", async () => {
  const { s, room, seen } = await joined(false, [
    { user: "a", sessions: [{ id: "t2", expires: "x", state: { status: "away" } }] },
    { user: "d", sessions: [] },
  ], { seq: 3 });
  s.recv(eventFrame("r", 4, { kind: "online", reason: "joined", user: "b", session: "p1", sessions: 1 }));
  s.recv(eventFrame("r", 5, { kind: "update", reason: "state", user: "b", session: "p1", state: "x", sessions: 1 }));
  s.recv(eventFrame("r", 6, { kind: "update", reason: "state", user: "a", session: "t2", sessions: 2 })); // cleared: entry goes
  s.recv(eventFrame("r", 7, { kind: "update", reason: "joined", user: "d", session: "q", sessions: 2 })); // not for us: ignored
  s.recv(eventFrame("r", 8, { kind: "update", reason: "left", user: "d", session: "q9", sessions: 1 })); // no state: nothing shows
  assert.deepEqual(plain(room.members()), [
    { user: "a", sessions: [] },
    { user: "b", sessions: [{ id: "p1", state: "x" }] },
    { user: "d", sessions: [] },
  ]);
  assert.deepEqual(seen.map(([t, u]) => t + ":" + u), ["join:a", "join:d", "sync:2", "join:b", "update:b", "update:a"]);
});

test("a resync snapshot replaces the view and emits the difference, then sync", async () => {
  const { s, room, seen } = await joined(true, [
    { user: "a", sessions: [{ id: "1" }] },
    { user: "b", sessions: [{ id: "2", state: "old" }] },
    { user: "c", sessions: [{ id: "3" }] },
  ], { seq: 5 });
  const before = room.members();
  seen.length = 0;
  s.recv(snapshotFrame("r", [
    { user: "a", sessions: [{ id: "1" }] },
    { user: "b", sessions: [{ id: "2", state: "new" }, { id: "4" }] },
    { user: "d", sessions: [{ id: "5" }] },
  ], { reason: "resync", seq: 40 }));
  assert.deepEqual(seen, [
    ["leave", "c", { reason: "sync" }],
    ["update", "b", { session: "2", state: "new", reason: "state" }],
    ["update", "b", { session: "4", state: undefined, reason: "joined" }],
    ["join", "d", { reason: "sync" }],
    ["sync", 3, undefined],
  ]);
  assert.equal(room.members()[0], before[0], "an unchanged member keeps its object");
});

test("events that arrive before this connection's snapshot are ignored", async () => {
  const h = setup();
  const s = await open(h);
  const room = h.client.room("r");
  s.recv(eventFrame("r", 1, { kind: "online", reason: "joined", user: "ghost", session: "g" }));
  answerJoin(s, "r", [{ user: "a", sessions: [] }], { seq: 1 });
  assert.deepEqual(plain(room.members()), [{ user: "a", sessions: [] }]);
});

// ---- large rooms ----

function pageFrame(ref, room, members, { seq, total, offset, epoch = 1 }) {
  return { type: "members", ref, room, snapshot: { region: "eu", room, total, offset, members, room_seq: seq, epoch } };
}
const mem = (u, st) => ({ user: u, sessions: st === undefined ? [] : [{ id: u + "-s", state: st }] });

test("paging: one member of overlap, events racing pages, late events below a page's seq", async () => {
  // Room: a..g, page size 3.
  const { s, room } = await joined(false, [mem("a"), mem("b"), mem("c")], { seq: 10, total: 7 });
  assert.equal(room.status, "joining", "not joined until every page is read");
  let req = s.last("members");
  assert.deepEqual([req.offset, req.limit], [2, 3]);
  // Event above the snapshot, for a user on a later page (e), before that page arrives.
  s.recv(eventFrame("r", 11, { kind: "update", reason: "state", user: "e", session: "e-s", state: "hi" }));
  // Page at seq 12: c,d,e (e's state at 12 already includes seq 11).
  s.recv(pageFrame(req.ref, "r", [mem("c"), mem("d"), mem("e", "hi")], { seq: 12, total: 7, offset: 2 }));
  req = s.last("members");
  assert.equal(req.offset, 4);
  // Seq 13 (d gets a state) is reflected in the next page at 14 but arrives after it;
  // seq 14 (g leaves) too.
  s.recv(pageFrame(req.ref, "r", [mem("e", "hi"), mem("f")], { seq: 14, total: 6, offset: 4 }));
  assert.equal(room.status, "joined");
  s.recv(eventFrame("r", 13, { kind: "update", reason: "state", user: "d", session: "d-s", state: "late" }));
  s.recv(eventFrame("r", 14, { kind: "offline", reason: "left", user: "g" }));
  s.recv(eventFrame("r", 15, { kind: "update", reason: "state", user: "f", session: "f-s", state: "new" }));
  assert.deepEqual(plain(room.members()), [mem("a"), mem("b"), mem("c"), mem("d", "late"), mem("e", "hi"), mem("f", "new")]);
});

test("paging: an event above the page's seq wins over the page's entry", async () => {
  const { s, room } = await joined(false, [mem("a"), mem("b")], { seq: 10, total: 4 });
  const req = s.last("members");
  s.recv(eventFrame("r", 11, { kind: "update", reason: "state", user: "c", session: "c-s", state: "one" }));
  s.recv(eventFrame("r", 12, { kind: "update", reason: "state", user: "c", session: "c-s", state: "two" }));
  s.recv(eventFrame("r", 13, { kind: "update", reason: "state", user: "c", session: "c-2", state: "other" }));
  // The page was read at 11: c has "one" and not yet c-2.
  s.recv(pageFrame(req.ref, "r", [mem("b"), mem("c", "one"), mem("d")], { seq: 11, total: 4, offset: 1 }));
  assert.deepEqual(plain(room.members()), [
    mem("a"), mem("b"),
    { user: "c", sessions: [{ id: "c-2", state: "other" }, { id: "c-s", state: "two" }] },
    mem("d"),
  ]);
});

test("paging: when the overlap user does not match, ask again from an earlier offset", async () => {
  const names = "abcdefghij".split("");
  const { s, room } = await joined(false, names.slice(0, 8).map((u) => mem(u)), { seq: 1, total: 10 });
  let req = s.last("members");
  assert.equal(req.offset, 7);
  // "b" left before the page was read: the page now starts one user later.
  s.recv(eventFrame("r", 2, { kind: "offline", reason: "left", user: "b" }));
  s.recv(pageFrame(req.ref, "r", ["i", "j"].map((u) => mem(u)), { seq: 2, total: 9, offset: 7 }));
  req = s.last("members");
  assert.equal(req.offset, 6, "asked again from earlier");
  s.recv(pageFrame(req.ref, "r", ["h", "i", "j"].map((u) => mem(u)), { seq: 2, total: 9, offset: 6 }));
  assert.equal(room.status, "joined");
  assert.deepEqual(room.members().map((m) => m.user), ["a", "c", "d", "e", "f", "g", "h", "i", "j"]);
});

test("a page of an older snapshot is dropped", async () => {
  const { s, room } = await joined(false, [mem("a"), mem("b")], { seq: 1, total: 3 });
  const old = s.last("members");
  s.recv(snapshotFrame("r", [mem("x")], { reason: "resync", seq: 9 }));
  s.recv(pageFrame(old.ref, "r", [mem("b"), mem("c")], { seq: 2, total: 3, offset: 1 }));
  assert.deepEqual(room.members().map((m) => m.user), ["x"]);
});

// ---- oracle: a random model room against the client's fold ----

function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class ModelRoom {
  constructor(rand, detail) {
    this.rand = rand;
    this.detail = detail;
    this.users = new Map(); // user -> Map(session -> state|undefined)
    this.seq = 0;
    this.sid = 0;
  }
  pick(arr) { return arr[Math.floor(this.rand() * arr.length)]; }
  // The wire members (what a snapshot or page lists for this client).
  wire() {
    return [...this.users.keys()].sort().map((u) => ({
      user: u, until: "t",
      sessions: [...this.users.get(u)].filter(([, st]) => this.detail || st !== undefined)
        .map(([id, st]) => (st === undefined ? { id, expires: "t" } : { id, expires: "t", state: st })),
    }));
  }
  expected() {
    return this.wire().map((m) => ({ user: m.user, sessions: m.sessions.map(({ id, state }) => (state === undefined ? { id } : { id, state })).sort((a, b) => (a.id < b.id ? -1 : 1)) }));
  }
  // One change; returns the event this client receives, or null (none for it).
  step() {
    const users = [...this.users.keys()];
    const r = this.rand();
    const states = [undefined, "away", { s: 1 }, [1, 2], 7];
    const ev = (fields) => ({ ...fields, seq: ++this.seq, sessions: fields.user && this.users.has(fields.user) ? this.users.get(fields.user).size : 0 });
    if (r < 0.25 || users.length === 0) {
      const u = "u" + String(Math.floor(this.rand() * 40)).padStart(2, "0");
      if (this.users.has(u)) return null;
      const id = "s" + ++this.sid;
      this.users.set(u, new Map([[id, undefined]]));
      return ev({ kind: "online", reason: "joined", user: u, session: id });
    }
    const u = this.pick(users);
    const ss = this.users.get(u);
    if (r < 0.4) {
      const id = "s" + ++this.sid;
      ss.set(id, undefined);
      const e = ev({ kind: "update", reason: "joined", user: u, session: id });
      return this.detail ? e : null; // only sent with detail (the seq is spent either way)
    }
    if (r < 0.75) {
      const id = this.pick([...ss.keys()]);
      const st = this.pick(states);
      if (JSON.stringify(ss.get(id)) === JSON.stringify(st)) return null; // unchanged: announces nothing
      ss.set(id, st);
      const e = ev({ kind: "update", reason: "state", user: u, session: id });
      if (st !== undefined) e.state = st;
      return e;
    }
    if (r < 0.9 && ss.size > 1) {
      const id = this.pick([...ss.keys()]);
      ss.delete(id);
      return ev({ kind: "update", reason: this.pick(["left", "expired"]), user: u, session: id });
    }
    this.users.delete(u);
    return ev({ kind: "offline", reason: this.pick(["left", "expired", "region_lost"]), user: u });
  }
}

// Two clients on the same stream: `batched` gets a random split of the
// events into `event` and `events` frames, `single` gets one `event` frame
// each. Both must fold to the model's view and emit the same events.
async function twin(detail) {
  const mk = async () => {
    const h = setup();
    const s = await open(h, { limits: { frame_rate: 1e6, frame_burst: 1e6 } }); // pacing is tested elsewhere
    const room = h.client.room("r", detail ? { detail: "sessions" } : undefined);
    const log = [];
    for (const t of ["join", "leave", "update", "sync"]) room.on(t, (m, c) => log.push([t, t === "sync" ? m.length : m.user, c]));
    return { h, s, room, log };
  };
  return { batched: await mk(), single: await mk() };
}

test("oracle: folded members() equals the model's snapshot (random rooms, detail on and off, paging, batched and single events)", async () => {
  for (let seed = Number(process.env.SEED || 1); seed <= Number(process.env.SEED || process.env.SEEDS || 150); seed++) {
    const rand = rng(seed);
    const split = rng(seed + 1e6); // its own stream: the model's schedule stays the same as without batching
    const detail = rand() < 0.5;
    const model = new ModelRoom(rand, detail);
    for (let i = 0; i < 15; i++) model.step(); // a room that already has members
    const { batched, single } = await twin(detail);
    const both = [batched, single];
    assert.equal(batched.s.last("join").batch, true, "joins ask for events frames");
    let pageSize = 2 + Math.floor(rand() * 6);
    const sendSnapshot = (reason) => {
      const all = model.wire();
      for (const c of both) c.s.recv(snapshotFrame("r", all.slice(0, pageSize), { ref: reason === "join" ? c.s.last("join").ref : undefined, reason, seq: model.seq, total: all.length }));
    };
    sendSnapshot("join");
    let queue = []; // events generated but not delivered yet (they can trail pages)
    let answered = 0; // members requests answered so far (the same for both clients)
    const answerPage = () => {
      const n = batched.s.frames("members").length;
      assert.equal(single.s.frames("members").length, n, `seed ${seed}: both clients page alike`);
      if (answered >= n) return false;
      const all = model.wire();
      for (const c of both) {
        const q = c.s.frames("members")[answered];
        c.s.recv(pageFrame(q.ref, "r", all.slice(q.offset, q.offset + q.limit), { seq: model.seq, total: all.length, offset: q.offset }));
      }
      answered++;
      return true;
    };
    const deliver = (evs) => {
      for (const e of evs) single.s.recv(eventFrame("r", e.seq, e));
      // A random split: runs of 1..4 events, each run alone or as one events frame.
      for (let i = 0; i < evs.length;) {
        const n = 1 + Math.floor(split() * 4);
        const run = evs.slice(i, i + n);
        i += n;
        if (split() < 0.7) batched.s.recv(eventsFrame("r", run));
        else for (const e of run) batched.s.recv(eventFrame("r", e.seq, e));
      }
    };
    const check = (where) => {
      assert.deepEqual(batched.log, single.log, `seed ${seed} ${where}: same events emitted`);
      assert.deepEqual(plain(batched.room.members()), plain(single.room.members()), `seed ${seed} ${where}: same view`);
      if (queue.length || !batched.room.complete) return;
      assert.deepEqual(plain(batched.room.members()), model.expected(), `seed ${seed} (detail ${detail}) ${where}`);
    };
    for (let step = 0; step < 250; step++) {
      const r = rand();
      if (r < 0.45) {
        const e = model.step();
        if (e) queue.push(e);
      } else if (r < 0.75) {
        const n = 1 + Math.floor(rand() * 3);
        deliver(queue.splice(0, n));
      } else if (r < 0.97) {
        answerPage();
      } else {
        // Resync: events continue from the new snapshot.
        queue = [];
        pageSize = 2 + Math.floor(rand() * 6);
        sendSnapshot("resync");
      }
      check(`step ${step}`);
    }
    deliver(queue.splice(0));
    while (answerPage());
    for (const c of both) assert.deepEqual(c.h.errors, []);
    check("end");
    assert.ok(batched.room.complete, `seed ${seed}: paging finished (status ${batched.room.status}, ${batched.s.frames("members").length} requests, ${answered} answered)`);
    for (const c of both) c.h.client.close();
  }
});
