// Batched events: `events` frames fold exactly as the same events sent singly.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setup, open, answerJoin, eventFrame, eventsFrame, snapshotFrame, plain } from "./helpers.js";

async function joined(opts) {
  const h = setup();
  const s = await open(h);
  const room = h.client.room("lobby", opts);
  const seen = [];
  for (const t of ["join", "leave", "update", "sync"]) room.on(t, (m, c) => seen.push([t, t === "sync" ? m.length : m.user, c]));
  return { h, s, room, seen };
}

test("joins ask for events frames unless batch is false; present false only when asked", async () => {
  const { h, s } = await joined();
  assert.deepEqual(s.last("join"), { type: "join", room: "lobby", batch: true, ref: s.last("join").ref });
  h.client.room("solo", { batch: false, detail: "sessions" });
  assert.deepEqual(s.last("join"), { type: "join", room: "solo", detail: "sessions", ref: s.last("join").ref });
  h.client.room("watcher", { present: false });
  assert.deepEqual(s.last("join"), { type: "join", room: "watcher", batch: true, present: false, ref: s.last("join").ref });
  await assert.rejects(h.client.room("watcher").setState(1), { code: "not_joined" });
  assert.equal(s.frames("state").length, 0, "no state frame for a room without a session");
});

test("the spec's events frame: each entry applied as its event, in order", async () => {
  const { s, room, seen } = await joined();
  answerJoin(s, "lobby", [{ user: "u_9001", sessions: [] }], { seq: 17 });
  seen.length = 0;
  s.recv({
    type: "events", room: "lobby", region: "eu", epoch: 1764444000000,
    events: [[18, "online", "joined", "u_4242", "tab-3f9a", 1],
      [19, "update", "state", "u_4242", "tab-3f9a", 1, { status: "away" }],
      [20, "offline", "left", "u_9001", "", 0]],
  });
  assert.deepEqual(plain(room.members()), [{ user: "u_4242", sessions: [{ id: "tab-3f9a", state: { status: "away" } }] }]);
  assert.deepEqual(seen, [
    ["join", "u_4242", { reason: "joined" }],
    ["update", "u_4242", { session: "tab-3f9a", state: { status: "away" }, reason: "state" }],
    ["leave", "u_9001", { reason: "left" }],
  ]);
});

test("an update without index 6 clears the state; with detail the session stays", async () => {
  const { s, room } = await joined({ detail: "sessions" });
  answerJoin(s, "lobby", [{ user: "a", sessions: [{ id: "t", state: 1 }] }], { seq: 1 });
  s.recv(eventsFrame("lobby", [{ seq: 2, kind: "update", reason: "state", user: "a", session: "t", sessions: 1 }]));
  assert.deepEqual(plain(room.members()), [{ user: "a", sessions: [{ id: "t" }] }]);
  s.recv(eventsFrame("lobby", [{ seq: 3, kind: "update", reason: "state", user: "a", session: "t", sessions: 1, state: null }]));
  assert.deepEqual(plain(room.members()), [{ user: "a", sessions: [{ id: "t" }] }], "a null state is no state");
});

test("event and events frames interleave; copies of an applied seq are skipped", async () => {
  const { s, room, seen } = await joined();
  answerJoin(s, "lobby", [], { seq: 5 });
  seen.length = 0;
  const e = (seq, user, st) => ({ seq, kind: "update", reason: "state", user, session: user + "-t", sessions: 1, state: st });
  s.recv(eventFrame("lobby", 6, e(6, "a", 1)));
  s.recv(eventsFrame("lobby", [e(7, "a", 2), e(8, "b", 1)]));
  s.recv(eventFrame("lobby", 9, e(9, "a", 3)));
  s.recv(eventsFrame("lobby", [e(8, "b", 1), e(9, "a", 3)])); // copies (a join and a watch of one room)
  s.recv(eventFrame("lobby", 5, e(5, "a", "old"))); // already in the snapshot
  assert.deepEqual(plain(room.members()), [
    { user: "a", sessions: [{ id: "a-t", state: 3 }] },
    { user: "b", sessions: [{ id: "b-t", state: 1 }] },
  ]);
  assert.deepEqual(seen.map(([t, u]) => t + ":" + u), ["join:a", "update:a", "join:b", "update:a"]);
  // A copy with a higher seq for one user does not hide another user's
  // lower seqs: the streams may lag each other (a batch waits for its tick).
  s.recv(eventFrame("lobby", 12, e(12, "a", 4))); // say, by a watch's stream, ahead
  s.recv(eventsFrame("lobby", [e(10, "b", 2), e(11, "c", 1), e(12, "a", 4)])); // the room's tick
  assert.deepEqual(plain(room.members()).map((m) => [m.user, m.sessions[0].state]), [["a", 4], ["b", 2], ["c", 1]]);
  // A resync starts a new numbering: lower seqs apply again after it.
  s.recv(snapshotFrame("lobby", [], { reason: "resync", seq: 2, epoch: 2 }));
  s.recv(eventsFrame("lobby", [e(3, "c", 1)], { epoch: 2 }));
  assert.deepEqual(room.members().map((m) => m.user), ["c"]);
  s.recv(eventFrame("lobby", 3, e(3, "c", 9))); // a copy in the new numbering
  assert.equal(room.members()[0].sessions[0].state, 1);
});

test("events frames before this connection's snapshot, malformed entries and unknown rooms are ignored", async () => {
  const { h, s, room } = await joined();
  s.recv(eventsFrame("lobby", [{ seq: 1, kind: "online", reason: "joined", user: "ghost", session: "g" }]));
  answerJoin(s, "lobby", [{ user: "a", sessions: [] }], { seq: 1 });
  const bad = [
    { type: "events", room: "lobby" }, { type: "events", room: "lobby", events: "x" }, { type: "events", events: [[2, "online", "joined", "x", "t", 1]] },
    { type: "events", room: "other", region: "eu", epoch: 1, events: [[2, "online", "joined", "x", "t", 1]] },
    { type: "events", room: "lobby", region: "eu", epoch: 1, events: [null, [], ["2", "online"], [2, "online", "joined", 7, "t", 1], { seq: 2 }, [3, "online", "joined", "b", "t", 1]] },
  ];
  for (const f of bad) s.recv(f);
  assert.deepEqual(room.members().map((m) => m.user), ["a", "b"], "the good entry among bad ones still applies");
  assert.deepEqual(h.errors, []);
});
