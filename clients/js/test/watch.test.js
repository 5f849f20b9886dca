// Watch lists: follow some users of a room without joining it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setup, open, hello, answerJoin, eventFrame, eventsFrame, plain, flush } from "./helpers.js";

function watchingFrame(ref, room, users, members, { seq = 0, reason = "watch", epoch = 1 } = {}) {
  const f = { type: "watching", ref, room, reason, users };
  if (members) f.snapshot = { region: "eu", room, at: "2026-11-29T19:48:46Z", total: members.length, offset: 0, members, room_seq: seq, epoch, stream_seq: 0 };
  return f;
}
// Answers the newest watch of room on socket s with the given members.
function answerWatch(s, room, members, opts) {
  const w = s.frames("watch").filter((f) => f.room === room).pop();
  s.recv(watchingFrame(w.ref, room, w.users, w.users.length ? members : undefined, opts));
  return w;
}
const mem = (u, st) => ({ user: u, until: "t", sessions: st === undefined ? [] : [{ id: u + "-t", expires: "t", state: st }] });
// A watch list's event frame (marked watch:true), and the room's own.
const ev = (seq, fields) => ({ ...eventFrame("lobby", seq, { sessions: 1, ...fields }), watch: true });
const roomEv = (seq, fields) => eventFrame("lobby", seq, { sessions: 1, ...fields });

function record(w) {
  const seen = [];
  for (const t of ["join", "leave", "update", "sync", "status", "error"]) {
    w.on(t, (m, c) => seen.push(t === "sync" ? ["sync", m.length] : t === "status" ? ["status", m] : t === "error" ? ["error", m.code] : [t, m.user, c]));
  }
  return seen;
}

test("watch: the frame, the spec's reply, then the watched users' events", async () => {
  const h = setup();
  const s = await open(h);
  const w = h.client.watch("lobby", ["u_1", "u_2", "u_3"]);
  const seen = record(w);
  const f = s.last("watch");
  assert.deepEqual(f, { type: "watch", room: "lobby", users: ["u_1", "u_2", "u_3"], ref: f.ref });
  assert.equal(w.status, "pending");
  assert.deepEqual(w.users, ["u_1", "u_2", "u_3"]);
  s.recv(ev(52011, { kind: "online", reason: "joined", user: "u_1", session: "x" })); // before the reply: stale
  s.recv({
    type: "watching", ref: f.ref, room: "lobby", reason: "watch", users: ["u_1", "u_2", "u_3"],
    snapshot: { region: "eu", room: "lobby", at: "…", total: 1, offset: 0, members: [{ user: "u_2", until: "…", sessions: [] }], room_seq: 52011, epoch: 1764444000000, stream_seq: 0 },
  });
  await w.ready;
  assert.equal(w.status, "active");
  assert.equal(w.region, "eu");
  assert.deepEqual(plain(w.members()), [{ user: "u_2", sessions: [] }]);
  s.recv(ev(52011, { kind: "offline", reason: "left", user: "u_2" })); // in the reply already
  s.recv(ev(52012, { kind: "online", reason: "joined", user: "u_1", session: "a" }));
  s.recv(ev(52013, { kind: "online", reason: "joined", user: "u_9", session: "b" })); // not watched
  s.recv(ev(52014, { kind: "update", reason: "state", user: "u_2", session: "p", state: { status: "away" } }));
  s.recv(ev(52015, { kind: "update", reason: "joined", user: "u_1", session: "c" })); // not kept: no detail
  s.recv(ev(52016, { kind: "offline", reason: "expired", user: "u_1" }));
  assert.deepEqual(plain(w.members()), [{ user: "u_2", sessions: [{ id: "p", state: { status: "away" } }] }]);
  assert.deepEqual(seen, [
    ["join", "u_2", { reason: "sync" }], ["status", "active"], ["sync", 1],
    ["join", "u_1", { reason: "joined" }],
    ["update", "u_2", { session: "p", state: { status: "away" }, reason: "state" }],
    ["leave", "u_1", { reason: "expired" }],
  ]);
  assert.deepEqual(h.errors, []);
});

test("watch: subscribe/getSnapshot are stable until the view changes", async () => {
  const h = setup();
  const s = await open(h);
  const w = h.client.watch("lobby", ["a", "b"]);
  const { subscribe, getSnapshot } = w;
  let calls = 0;
  subscribe(() => calls++);
  const empty = getSnapshot();
  answerWatch(s, "lobby", [mem("a", 1)], { seq: 5 });
  const s1 = getSnapshot();
  assert.notEqual(s1, empty);
  assert.ok(Object.isFrozen(s1) && Object.isFrozen(s1[0]));
  s.recv(ev(6, { kind: "update", reason: "left", user: "a", session: "nostate" })); // changes nothing visible
  assert.equal(getSnapshot(), s1);
  s.recv(ev(7, { kind: "online", reason: "joined", user: "b", session: "t" }));
  assert.equal(getSnapshot()[0], s1[0], "unchanged members keep their objects");
  assert.equal(calls, 2);
});

test("watch: update replaces the list with a new watch; the reply replaces the view", async () => {
  const h = setup();
  const s = await open(h);
  const w = h.client.watch("lobby", ["a", "b"]);
  answerWatch(s, "lobby", [mem("a"), mem("b", 1)], { seq: 10 });
  const seen = record(w);
  const p = w.update(["b", "c"]);
  assert.equal(w.ready, p);
  const f = s.last("watch");
  assert.deepEqual(f.users, ["b", "c"]);
  // Until the reply the node follows the old list.
  s.recv(ev(11, { kind: "update", reason: "state", user: "a", session: "a-t", state: 2 }));
  s.recv(ev(12, { kind: "online", reason: "joined", user: "c", session: "c-t" })); // c not watched yet: in the reply
  assert.deepEqual(w.members().map((m) => m.user), ["a", "b"]);
  s.recv(watchingFrame(f.ref, "lobby", ["b", "c"], [mem("b", 1), mem("c")], { seq: 12 }));
  await p;
  assert.deepEqual(plain(w.members()), [{ user: "b", sessions: [{ id: "b-t", state: 1 }] }, { user: "c", sessions: [] }]);
  assert.deepEqual(w.users, ["b", "c"]);
  s.recv(ev(13, { kind: "online", reason: "joined", user: "a", session: "a2" })); // a is no longer watched
  assert.deepEqual(w.members().map((m) => m.user), ["b", "c"]);
  assert.deepEqual(seen, [
    ["update", "a", { session: "a-t", state: 2, reason: "state" }],
    ["leave", "a", { reason: "sync" }], ["join", "c", { reason: "sync" }], ["sync", 2],
  ]);
  // client.watch of a watched room: the same object, its list replaced.
  assert.equal(h.client.watch("lobby", ["b", "c"]), w);
  assert.equal(s.frames("watch").length, 2, "the same list is not sent again");
  assert.equal(h.client.watch("lobby", ["d"]), w);
  assert.deepEqual(s.last("watch").users, ["d"]);
});

test("watch: close sends users [] and empties the view; a later watch is a new object", async () => {
  const h = setup();
  const s = await open(h);
  const w = h.client.watch("lobby", ["a"]);
  answerWatch(s, "lobby", [mem("a")], { seq: 1 });
  let calls = 0;
  w.subscribe(() => calls++);
  const p = w.close();
  assert.equal(w.status, "closed");
  assert.deepEqual(w.members(), []);
  assert.equal(calls, 1);
  assert.deepEqual(h.client.watches(), []);
  const f = s.last("watch");
  assert.deepEqual(f, { type: "watch", room: "lobby", users: [], ref: f.ref });
  s.recv(watchingFrame(f.ref, "lobby", [], undefined));
  await p;
  s.recv(ev(2, { kind: "online", reason: "joined", user: "a", session: "t" }));
  assert.deepEqual(w.members(), []);
  await assert.rejects(w.update(["a"]), { code: "closed" });
  assert.notEqual(h.client.watch("lobby", ["a"]), w);
  // Closing a watch never sent: nothing to send.
  const h2 = setup();
  const w2 = h2.client.watch("lobby", ["a"]);
  await w2.close();
  await assert.rejects(w2.ready, { code: "closed" });
  const s2 = await open(h2);
  assert.equal(s2.frames("watch").length, 0);
});

test("watch: an unasked watching (resync) replaces the view; before the reply it is ignored", async () => {
  const h = setup();
  const s = await open(h);
  const w = h.client.watch("lobby", ["a", "b"]);
  s.recv(watchingFrame(undefined, "lobby", ["a", "b"], [mem("a")], { reason: "resync", seq: 3 }));
  assert.deepEqual(w.members(), []);
  answerWatch(s, "lobby", [mem("a"), mem("b")], { seq: 10 });
  const seen = record(w);
  s.recv(watchingFrame(undefined, "lobby", ["a", "b"], [mem("b", "x")], { reason: "resync", seq: 2, epoch: 2 }));
  assert.deepEqual(plain(w.members()), [{ user: "b", sessions: [{ id: "b-t", state: "x" }] }]);
  assert.deepEqual(seen, [["leave", "a", { reason: "sync" }], ["update", "b", { session: "b-t", state: "x", reason: "state" }], ["sync", 1]]);
  s.recv(ev(3, { kind: "online", reason: "joined", user: "a", session: "t" })); // the new numbering continues
  assert.deepEqual(w.members().map((m) => m.user), ["a", "b"]);
});

test("watch: a reconnect sends the watch again (the latest list) and keeps the view until the reply", async () => {
  const h = setup();
  let s = await open(h);
  const w = h.client.watch("lobby", ["a", "b"]);
  answerWatch(s, "lobby", [mem("a", 1)], { seq: 4 });
  const view = w.members();
  s.serverClose(1006);
  await flush();
  assert.equal(w.status, "rewatching");
  assert.equal(w.members(), view);
  const p = w.update(["a", "c"]); // while offline: sent after the next hello
  await h.clock.advance(1000);
  s = h.ws.last;
  s.open();
  s.recv(hello());
  const frames = s.frames("watch");
  assert.equal(frames.length, 1);
  assert.deepEqual(frames[0].users, ["a", "c"]);
  s.recv(ev(5, { kind: "offline", reason: "left", user: "a" })); // before this connection's reply: stale
  assert.equal(w.members(), view);
  answerWatch(s, "lobby", [mem("a", 1)], { seq: 9 });
  await p;
  assert.equal(w.status, "active");
  assert.equal(w.members(), view, "same view, same reference");
  // An empty list ends the watch, and is not sent to a new connection.
  const pe = w.update([]);
  assert.deepEqual(s.last("watch").users, []);
  answerWatch(s, "lobby", []);
  await pe;
  assert.deepEqual(w.members(), []);
  s.serverClose(1012);
  await h.clock.advance(300);
  s = h.ws.last;
  s.open();
  s.recv(hello());
  assert.equal(s.frames("watch").length, 0);
  assert.equal(w.status, "active");
});

test("watch: bad input is refused locally with invalid_watch; repeated ids are sent once", async () => {
  const h = setup();
  const s = await open(h, { limits: { max_watch_users: 3 } });
  assert.equal(h.client.limits.max_watch_users, 3);
  for (const bad of [undefined, "a", [1], ["ok", ""], ["a b"], ["x".repeat(65)], ["a", "b", "c", "d"]]) {
    assert.throws(() => h.client.watch("lobby", bad), { code: "invalid_watch" }, JSON.stringify(bad));
  }
  assert.throws(() => h.client.watch("", ["a"]), TypeError);
  const w = h.client.watch("lobby", ["a", "b", "a", "c", "b"]);
  assert.deepEqual(s.last("watch").users, ["a", "b", "c"]);
  await assert.rejects(w.update(["a", "b", "c", "d"]), { code: "invalid_watch" });
  await assert.rejects(w.update(["ü"]), { code: "invalid_watch" });
  assert.equal(s.frames("watch").length, 1, "nothing sent for refused lists");
  assert.deepEqual(w.users, ["a", "b", "c"]);
  // A frame over max_frame_bytes would close the connection (1009): refused before.
  const h2 = setup();
  await open(h2);
  const long = Array.from({ length: 100 }, (_, i) => String(i).padStart(64, "u"));
  assert.throws(() => h2.client.watch("lobby", long), (e) => e.code === "invalid_watch" && /4096/.test(e.message));
  h2.client.watch("lobby", long.map((u) => u.slice(-8)));
});

test("watch: errors of the node reject with their code; unavailable is retried", async () => {
  const h = setup();
  const s = await open(h);
  // forbidden on the first list: the watch fails.
  const w1 = h.client.watch("secret", ["a"]);
  const seen = record(w1);
  s.recv({ type: "error", code: "forbidden", message: "no", ref: s.last("watch").ref });
  await assert.rejects(w1.ready, { code: "forbidden" });
  assert.equal(w1.status, "failed");
  assert.equal(w1.error.code, "forbidden");
  assert.deepEqual(seen, [["status", "failed"], ["error", "forbidden"]]);
  assert.equal(h.errors.at(-1).code, "forbidden");
  assert.deepEqual(h.client.watches(), []);
  // too_many_rooms likewise.
  const w2 = h.client.watch("r33", ["a"]);
  s.recv({ type: "error", code: "too_many_rooms", message: "32", ref: s.last("watch").ref });
  await assert.rejects(w2.ready, { code: "too_many_rooms" });
  assert.equal(w2.status, "failed");
  // A refused replacement keeps the old list and view.
  const w3 = h.client.watch("lobby", ["a"]);
  answerWatch(s, "lobby", [mem("a")], { seq: 1 });
  const view = w3.members();
  const p = w3.update(["a", "b"]);
  s.recv({ type: "error", code: "invalid_watch", message: "global view", ref: s.last("watch").ref });
  await assert.rejects(p, (e) => e.code === "invalid_watch" && e.message === "global view");
  assert.equal(w3.status, "active");
  assert.deepEqual(w3.users, ["a"]);
  assert.equal(w3.members(), view);
  s.recv(ev(2, { kind: "online", reason: "joined", user: "b", session: "t" }));
  assert.deepEqual(w3.members().map((m) => m.user), ["a"], "b is not watched");
  // unavailable: the node no longer watches the room. Sent again after
  // retry_after_ms (jittered); the promise waits, the view stays.
  const n = s.frames("watch").length;
  const p2 = w3.update(["a", "c"]);
  s.recv({ type: "error", code: "unavailable", message: "busy", ref: s.last("watch").ref, retry_after_ms: 800 });
  assert.equal(w3.status, "rewatching");
  assert.equal(w3.members(), view);
  s.recv(ev(3, { kind: "offline", reason: "left", user: "a" })); // not from this watch (the node holds none)
  assert.equal(w3.members(), view);
  await h.clock.advance(799);
  assert.equal(s.frames("watch").length, n + 1);
  await h.clock.advance(1);
  assert.equal(s.frames("watch").length, n + 2);
  answerWatch(s, "lobby", [mem("c")], { seq: 5 });
  await p2;
  assert.equal(w3.status, "active");
  assert.deepEqual(w3.members().map((m) => m.user), ["c"]);
  // A refusal after an unavailable: the node holds no list, so the watch fails.
  const w4 = h.client.watch("other", ["a"]);
  s.recv({ type: "error", code: "unavailable", message: "busy", ref: s.last("watch").ref, retry_after_ms: 10 });
  await h.clock.advance(20);
  s.recv({ type: "error", code: "forbidden", message: "no", ref: s.last("watch").ref });
  await assert.rejects(w4.ready, { code: "forbidden" });
  assert.equal(w4.status, "failed");
});

test("watch: a refresh that takes the room away ends the watch (watching, reason revoked)", async () => {
  const h = setup();
  let s = await open(h);
  const w = h.client.watch("team7-a", ["a"]);
  answerWatch(s, "team7-a", [mem("a")], { seq: 1 });
  let calls = 0;
  w.subscribe(() => calls++);
  const p = w.update(["a", "b"]); // pending while it happens
  s.recv({ type: "watching", room: "team7-a", reason: "revoked", users: [] });
  assert.equal(w.status, "revoked");
  assert.deepEqual(w.members(), []);
  assert.equal(calls, 1);
  await assert.rejects(p, { code: "revoked" });
  assert.deepEqual(h.client.watches(), []);
  assert.deepEqual(h.errors, []);
  s.serverClose(1012);
  await h.clock.advance(300);
  s = h.ws.last;
  s.open();
  s.recv(hello());
  assert.equal(s.frames("watch").length, 0, "a revoked watch is not sent again");
});

test("watch: a refused re-watch after a reconnect fails the watch", async () => {
  const h = setup();
  let s = await open(h);
  const w = h.client.watch("team7-a", ["a"]);
  answerWatch(s, "team7-a", [mem("a")], { seq: 1 });
  s.serverClose(1006);
  await h.clock.advance(1000);
  s = h.ws.last;
  s.open();
  s.recv(hello());
  s.recv({ type: "error", code: "forbidden", message: "no longer granted", ref: s.last("watch").ref });
  assert.equal(w.status, "failed");
  assert.deepEqual(w.members(), []);
  assert.equal(h.errors.at(-1).code, "forbidden");
  await h.clock.advance(60000);
  assert.equal(s.frames("watch").length, 1, "not sent again");
});

test("watch and join of one room: each stream folds into its own view, in its own order", async () => {
  const h = setup();
  const s = await open(h);
  const room = h.client.room("lobby");
  answerJoin(s, "lobby", [mem("a"), mem("z")], { seq: 10 });
  const w = h.client.watch("lobby", ["a", "b"]);
  answerWatch(s, "lobby", [mem("a")], { seq: 12 });
  const roomSeen = [], watchSeen = [];
  room.on("update", (m, c) => roomSeen.push([m.user, c.state]));
  w.on("update", (m, c) => watchSeen.push([m.user, c.state]));
  // The watch's stream sends at once; the room's batch comes at its tick,
  // with an event of a (11) older than the watch's first (13): the room
  // still applies it.
  s.recv(ev(13, { kind: "update", reason: "state", user: "a", session: "a-t", state: 1 }));
  s.recv(ev(14, { kind: "online", reason: "joined", user: "b", session: "b-t" }));
  s.recv(eventsFrame("lobby", [
    { seq: 11, kind: "update", reason: "state", user: "a", session: "a-2", state: "second tab", sessions: 2 },
    { seq: 12, kind: "update", reason: "state", user: "z", session: "z-t", state: "zz", sessions: 1 },
    { seq: 13, kind: "update", reason: "state", user: "a", session: "a-t", state: 1, sessions: 2 },
    { seq: 14, kind: "online", reason: "joined", user: "b", session: "b-t", sessions: 1 },
  ]));
  s.recv(ev(15, { kind: "update", reason: "state", user: "a", session: "a-t", state: 2 }));
  s.recv(roomEv(15, { kind: "update", reason: "state", user: "a", session: "a-t", state: 2 }));
  assert.deepEqual(plain(room.members()), [
    { user: "a", sessions: [{ id: "a-2", state: "second tab" }, { id: "a-t", state: 2 }] }, { user: "b", sessions: [] }, { user: "z", sessions: [{ id: "z-t", state: "zz" }] },
  ]);
  assert.deepEqual(plain(w.members()), [{ user: "a", sessions: [{ id: "a-t", state: 2 }] }, { user: "b", sessions: [] }]);
  assert.deepEqual(roomSeen, [["a", "second tab"], ["z", "zz"], ["a", 1], ["a", 2]], "each change once, in the room's order");
  assert.deepEqual(watchSeen, [["a", 1], ["a", 2]]);
});

test("watch frames are paced with the rest: 40 watches never trip the server's limiter", async () => {
  const h = setup({ pingIntervalMs: 1e9 });
  const s = await open(h);
  for (let i = 0; i < 40; i++) h.client.watch("room" + i, ["a"]);
  await h.clock.advance(10000);
  assert.equal(s.frames("watch").length, 40);
  let tokens = 20, last = s.sent[0].at;
  for (const { at } of s.sent) {
    tokens = Math.min(20, tokens + ((at - last) * 10) / 1000);
    last = at;
    tokens -= 1;
    assert.ok(tokens >= 0, "would be rate_limited");
  }
});

test("client.close ends watches", async () => {
  const h = setup();
  const s = await open(h);
  const w = h.client.watch("lobby", ["a"]);
  answerWatch(s, "lobby", [mem("a")], { seq: 1 });
  h.client.close();
  assert.equal(w.status, "closed");
  assert.deepEqual(w.members(), []);
  assert.throws(() => h.client.watch("lobby", ["a"]), { code: "closed" });
});
