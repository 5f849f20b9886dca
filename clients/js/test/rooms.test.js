// Requests, errors, room lifecycle, subscribe/getSnapshot.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setup, open, answerJoin, eventFrame, snapshotFrame, plain, flush } from "./helpers.js";

test("same room twice is the same object; a left room is a new one", async () => {
  const h = setup();
  const s = await open(h);
  const r = h.client.room("r");
  assert.equal(h.client.room("r"), r);
  answerJoin(s, "r", []);
  const p = r.leave();
  assert.equal(r.status, "left");
  const leave = s.last("leave");
  s.recv({ type: "left", ref: leave.ref, room: "r" });
  await p;
  assert.notEqual(h.client.room("r"), r);
});

test("errors reject requests with code, message and retryAfterMs; unasked errors go to the client", async () => {
  const h = setup();
  const s = await open(h);
  const r = h.client.room("r");
  answerJoin(s, "r", []);
  const p = r.setState("x");
  s.recv({ type: "error", code: "not_joined", message: "nope", ref: s.last("state").ref });
  await assert.rejects(p, (e) => e.code === "not_joined" && e.message === "nope");
  assert.equal(r.state, null, "a refused state is not kept as the desired one");
  s.recv({ type: "error", code: "rate_limited", message: "slow down" });
  s.recv({ type: "error", code: "bad_frame", message: "?" });
  assert.deepEqual(h.errors.map((e) => e.code), ["rate_limited", "bad_frame"]);
});

test("join refused: room status failed, room and client error", async () => {
  const h = setup();
  const s = await open(h);
  const r = h.client.room("secret");
  let roomErr;
  r.on("error", (e) => { roomErr = e; });
  const st = r.setState(1);
  s.recv({ type: "error", code: "forbidden", message: "no", ref: s.last("join").ref });
  assert.equal(r.status, "failed");
  assert.equal(r.error.code, "forbidden");
  assert.equal(h.errors.at(-1).code, "forbidden");
  await assert.rejects(st, { code: "forbidden" });
  assert.equal(roomErr, undefined, "join errors go to the client's error event");
});

test("unavailable on join and on state: retried after retry_after_ms, jittered", async () => {
  const h = setup({ random: () => 0.5 });
  const s = await open(h);
  const r = h.client.room("r");
  s.recv({ type: "error", code: "unavailable", message: "busy", ref: s.last("join").ref, retry_after_ms: 800 });
  await h.clock.advance(799);
  assert.equal(s.frames("join").length, 1);
  await h.clock.advance(1);
  assert.equal(s.frames("join").length, 2);
  answerJoin(s, "r", []);
  const p = r.setState({ a: 1 });
  s.recv({ type: "error", code: "unavailable", message: "busy", ref: s.last("state").ref, retry_after_ms: 1000 });
  await h.clock.advance(1000);
  const st = s.frames("state");
  assert.equal(st.length, 2);
  s.recv({ type: "state_set", ref: st[1].ref, room: "r" });
  await p;
});

test("setState promises settle in order; the last state wins while offline", async () => {
  const h = setup();
  let s = await open(h);
  const r = h.client.room("r");
  answerJoin(s, "r", []);
  s.serverClose(1006);
  await flush();
  const p1 = r.setState("a");
  const p2 = r.setState("b");
  await h.clock.advance(1000);
  s = h.ws.last;
  s.open();
  s.recv((await import("./helpers.js")).hello());
  answerJoin(s, "r", []);
  const st = s.frames("state");
  assert.equal(st.length, 1);
  assert.equal(st[0].state, "b");
  s.recv({ type: "state_set", ref: st[0].ref, room: "r" });
  await Promise.all([p1, p2]);
});

test("revoked: unasked left with reason revoked empties the view", async () => {
  const h = setup();
  const s = await open(h);
  const r = h.client.room("team7-a");
  answerJoin(s, "team7-a", [{ user: "x", sessions: [] }]);
  let n = 0;
  r.subscribe(() => n++);
  s.recv({ type: "left", room: "team7-a", reason: "revoked" });
  assert.equal(r.status, "revoked");
  assert.deepEqual(r.members(), []);
  assert.equal(n, 1);
  await assert.rejects(r.setState(1), { code: "not_joined" });
  s.serverClose(1012);
  await h.clock.advance(300);
  h.ws.last.open();
  h.ws.last.recv((await import("./helpers.js")).hello());
  assert.equal(h.ws.last.frames("join").length, 0, "a revoked room is not rejoined");
});

test("subscribe/getSnapshot: stable reference until the view changes; frozen data", async () => {
  const h = setup();
  const s = await open(h);
  const r = h.client.room("r");
  let calls = 0;
  const { subscribe, getSnapshot } = r; // handed over unbound, as React does
  const unsub = subscribe(() => calls++);
  const empty = getSnapshot();
  assert.equal(r.getSnapshot(), empty);
  answerJoin(s, "r", [{ user: "a", sessions: [{ id: "1", state: { s: 1 } }] }], { seq: 1 });
  const s1 = r.getSnapshot();
  assert.notEqual(s1, empty);
  assert.equal(r.getSnapshot(), s1);
  assert.equal(calls, 1);
  assert.ok(Object.isFrozen(s1) && Object.isFrozen(s1[0]) && Object.isFrozen(s1[0].sessions[0].state));
  assert.throws(() => { s1[0].sessions[0].state.s = 2; });
  // An update that changes nothing visible keeps the snapshot.
  s.recv(eventFrame("r", 2, { kind: "update", reason: "left", user: "a", session: "nostate" }));
  assert.equal(r.getSnapshot(), s1);
  s.recv(eventFrame("r", 3, { kind: "online", reason: "joined", user: "b", session: "2" }));
  const s2 = r.getSnapshot();
  assert.notEqual(s2, s1);
  assert.equal(s2[0], s1[0], "unchanged members keep their objects");
  assert.equal(calls, 2);
  unsub();
  s.recv(eventFrame("r", 4, { kind: "offline", reason: "left", user: "b" }));
  assert.equal(calls, 2);
});

test("malformed and unknown frames are ignored, never thrown", async () => {
  const h = setup();
  const s = await open(h);
  const r = h.client.room("r");
  answerJoin(s, "r", [{ user: "a", sessions: [] }], { seq: 1 });
  const bad = [
    "not json", "[]", "null", "42", '{"no":"type"}', { type: "future_frame", x: 1 },
    { type: "event" }, { type: "event", event: null }, { type: "event", event: { room: "r" } },
    { type: "event", event: { room: "r", user: "a", kind: "update" } },
    { type: "event", event: { room: "r", user: 5, kind: "online" } },
    { type: "snapshot", room: "r" }, { type: "snapshot", room: "r", snapshot: { members: "x" } },
    { type: "snapshot", room: "r", reason: "resync", snapshot: { members: [null, 3, { user: 1 }, { user: "b", sessions: "x" }] } },
    { type: "left" }, { type: "pong", ref: 7 }, { type: "error" }, { type: "hello", v: 1 },
  ];
  for (const f of bad) s.recv(f);
  assert.deepEqual(plain(r.members()), [{ user: "b", sessions: [] }]);
  assert.deepEqual(h.errors.map((e) => e.code), ["unknown"], "only the error frame without a code is reported");
  assert.equal(h.client.status, "open");
});

test("unknown fields are ignored", async () => {
  const h = setup();
  const s = await open(h);
  const r = h.client.room("r");
  const j = s.last("join");
  const f = snapshotFrame("r", [{ user: "a", sessions: [{ id: "1", state: 1, weird: true }], extra: 1 }], { ref: j.ref });
  f.future = { x: 1 };
  s.recv(f);
  assert.deepEqual(plain(r.members()), [{ user: "a", sessions: [{ id: "1", state: 1 }] }]);
});
