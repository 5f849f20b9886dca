// Count rooms: view "count", the latest count, rejoined after reconnects.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setup, open, hello, answerJoin, eventFrame, eventsFrame, snapshotFrame, flush } from "./helpers.js";

// As the spec shows them: whole counts, not tied to a room_seq.
const countFrame = (room, count, extra = {}) => ({ type: "count", room, count, ...extra });

test("count room: join with view count, the reply, updates, resync; stable getSnapshot", async () => {
  const h = setup();
  const s = await open(h);
  const room = h.client.room("lobby", { view: "count" });
  assert.equal(room.view, "count");
  const j = s.last("join");
  assert.deepEqual(j, { type: "join", room: "lobby", view: "count", ref: j.ref }, "no batch, no detail, no present");
  assert.equal(room.count(), undefined);
  assert.equal(room.getSnapshot(), null, "null before the first count");
  const seen = [];
  let calls = 0;
  const { subscribe, getSnapshot } = room; // handed over unbound, as React does
  subscribe(() => calls++);
  room.on("count", (n, c) => seen.push([n, c]));
  room.on("status", (st) => seen.push(st));

  s.recv(countFrame("lobby", 15000, { ref: j.ref, reason: "join" }));
  assert.equal(room.status, "joined");
  assert.equal(room.count(), 15000);
  assert.equal(room.total, 15000);
  const snap = getSnapshot();
  assert.deepEqual(snap, { count: 15000 });
  assert.ok(Object.isFrozen(snap));
  assert.equal(getSnapshot(), snap);
  assert.deepEqual(room.members(), []);

  s.recv(countFrame("lobby", 15003));
  assert.equal(room.count(), 15003);
  assert.notEqual(getSnapshot(), snap);
  const snap2 = getSnapshot();
  s.recv(countFrame("lobby", 15003, { reason: "resync" })); // the same count again: nothing changed
  assert.equal(getSnapshot(), snap2);
  s.recv(countFrame("lobby", 14990, { room_seq: 7, epoch: 2 })); // whole, as every count; fields the spec dropped are ignored
  assert.equal(room.count(), 14990);
  assert.equal(calls, 3);
  assert.deepEqual(seen, [
    "joined",
    [15000, { reason: "join" }],
    [15003, { reason: "update" }],
    [14990, { reason: "update" }],
  ]);
  // Member frames for the room are not for a count view.
  s.recv(snapshotFrame("lobby", [{ user: "a", sessions: [] }], { reason: "resync", seq: 9 }));
  s.recv(eventFrame("lobby", 10, { kind: "online", reason: "joined", user: "b", session: "t" }));
  s.recv(eventsFrame("lobby", [{ seq: 11, kind: "online", reason: "joined", user: "c", session: "t" }]));
  assert.deepEqual(room.members(), []);
  assert.equal(room.count(), 14990);
  assert.deepEqual(h.errors, []);
});

test("count room: present false only when asked; state refused locally then", async () => {
  const h = setup();
  const s = await open(h);
  const room = h.client.room("lobby", { view: "count", present: false });
  const j = s.last("join");
  assert.deepEqual(j, { type: "join", room: "lobby", view: "count", present: false, ref: j.ref });
  await assert.rejects(room.setState("x"), { code: "not_joined" });
  const mine = h.client.room("mine", { view: "count", present: true });
  assert.equal(s.last("join").present, undefined, "present true is the default: not sent");
  s.recv(countFrame("mine", 1, { ref: s.last("join").ref, reason: "join" }));
  const p = mine.setState({ typing: true });
  const st = s.last("state");
  assert.deepEqual(st.state, { typing: true }, "a counted member has a session and a state");
  s.recv({ type: "state_set", ref: st.ref, room: "mine" });
  await p;
});

test("count room: counts before the join reply are ignored; a refused join fails the room", async () => {
  const h = setup();
  const s = await open(h);
  const room = h.client.room("lobby", { view: "count", present: false });
  s.recv(countFrame("lobby", 99));
  assert.equal(room.count(), undefined);
  s.recv({ type: "error", code: "forbidden", message: "no observe claim", ref: s.last("join").ref });
  assert.equal(room.status, "failed");
  assert.equal(room.error.code, "forbidden");
  assert.equal(h.errors.at(-1).code, "forbidden");
  const again = h.client.room("lobby", { view: "count" });
  assert.notEqual(again, room, "a failed room is a new object next time");
});

test("count room: view mismatches and bad views are refused locally", async () => {
  const h = setup();
  await open(h);
  h.client.room("a");
  assert.throws(() => h.client.room("a", { view: "count" }), { code: "invalid_view" });
  h.client.room("b", { view: "count" });
  assert.throws(() => h.client.room("b"), { code: "invalid_view" });
  assert.equal(h.client.room("b", { view: "count" }).view, "count");
  assert.throws(() => h.client.room("c", { view: "list" }), { code: "invalid_view" });
  assert.throws(() => h.client.room("d", { view: "count", detail: "sessions" }), { code: "invalid_view" });
});

test("count room: reconnect rejoins with view count, keeps the last count while rejoining, then takes the new one", async () => {
  const h = setup();
  let s = await open(h);
  const room = h.client.room("lobby", { view: "count", present: false });
  s.recv(countFrame("lobby", 10, { ref: s.last("join").ref, reason: "join" }));
  const snap = room.getSnapshot();
  s.serverClose(1006);
  await flush();
  assert.equal(room.status, "rejoining");
  assert.equal(room.getSnapshot(), snap, "the last count stays until the new one");
  s.recv(countFrame("lobby", 11)); // a closed socket's frame: ignored
  await h.clock.advance(1000);
  s = h.ws.last;
  s.open();
  s.recv(hello());
  const j = s.last("join");
  assert.deepEqual(j, { type: "join", room: "lobby", view: "count", present: false, ref: j.ref });
  s.recv(countFrame("lobby", 12)); // unasked, before the reply on this connection: stale
  assert.equal(room.count(), 10);
  s.recv(countFrame("lobby", 12, { ref: j.ref, reason: "join" }));
  assert.equal(room.status, "joined");
  assert.equal(room.count(), 12);
  const lp = room.leave();
  assert.equal(room.status, "left");
  assert.equal(room.getSnapshot(), null);
  s.recv({ type: "left", ref: s.last("leave").ref, room: "lobby" });
  await lp;
});
