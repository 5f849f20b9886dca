// Connecting, reconnect policy, tokens, liveness, pacing.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setup, open, hello, answerJoin, eventFrame, plain, flush } from "./helpers.js";

test("connect: session and user in the URL, token as a subprotocol, nothing sent before hello", async () => {
  const calls = [];
  const h = setup({ url: "https://node.test/v1/ws", user: "dev1", getToken: async (o) => { calls.push(o); return "jwt.a.b"; } });
  h.client.room("r");
  await h.clock.advance(0);
  const s = h.ws.last;
  const u = new URL(s.url);
  assert.equal(u.protocol, "wss:");
  assert.equal(u.searchParams.get("session"), "s1");
  assert.equal(u.searchParams.get("user"), "dev1");
  assert.deepEqual(s.protocols, ["presence.v1", "bearer.jwt.a.b"]);
  assert.deepEqual(calls, [{ fresh: false }]);
  s.open();
  await flush();
  assert.equal(s.sent.length, 0, "waits for hello");
  assert.equal(h.client.status, "connecting");
  s.recv(hello({ user: "u_8827", limits: { max_state_bytes: 10 } }));
  assert.equal(h.client.status, "open");
  assert.equal(h.client.user, "u_8827");
  assert.equal(h.client.limits.max_state_bytes, 10);
  assert.equal(h.client.limits.frame_rate, 10, "defaults for absent limits");
  assert.deepEqual(s.frames().map((f) => f.type), ["join"]);
  await assert.rejects(h.client.room("r").setState("x".repeat(20)), { code: "invalid_state" });
});

test("connect: without a token only presence.v1 is offered", async () => {
  const h = setup({ getToken: async () => undefined });
  await h.clock.advance(0);
  assert.deepEqual(h.ws.last.protocols, ["presence.v1"]);
  const h2 = setup();
  await h2.clock.advance(0);
  assert.deepEqual(h2.ws.last.protocols, ["presence.v1"]);
  assert.throws(() => setup({ url: "ftp://x/" }), TypeError);
});

// Reconnect delay after a close: the time from the close to the next socket.
async function delayAfterClose(h, code) {
  const n = h.ws.sockets.length;
  const t0 = h.clock.t;
  h.ws.last.serverClose(code);
  await h.clock.advance(0);
  for (let i = 0; i < 100000 && h.ws.sockets.length === n; i++) await h.clock.advance(1);
  return h.clock.t - t0;
}

test("backoff before the first hello: full jitter, delay = random * min(10s, 500ms * 2^attempt)", async () => {
  for (const r of [0.999, 0.3]) {
    const h = setup({ random: () => r });
    await h.clock.advance(0); // the first socket, never opened
    const delays = [];
    for (let i = 0; i < 8; i++) delays.push(await delayAfterClose(h, 1006));
    delays.forEach((d, i) => {
      const bound = r * Math.min(10000, 500 * 2 ** i);
      assert.ok(Math.abs(d - bound) <= 1, `attempt ${i}: ${d} vs ${bound}`);
    });
    h.client.close();
  }
});

test("backoff after a drop: short jittered retries through the grace, then full jitter from 1 s to 10 s", async () => {
  for (const r of [0.999, 0.001]) {
    const h = setup({ random: () => r });
    await open(h, { offline_grace_ms: 12000 });
    const t0 = h.clock.t;
    const delays = [];
    while (h.clock.t - t0 < 60000) delays.push(await delayAfterClose(h, 1006));
    let at = 0;
    let late = 0;
    delays.forEach((d, i) => {
      if (at < 11000) {
        // inside the grace, up to 1 s before its end
        const cap = Math.min(1000, 500 * 2 ** i);
        const lo = i === 0 ? 0 : cap / 2;
        assert.ok(d >= lo - 1 && d <= cap + 1, `attempt ${i} at ${at}: ${d} outside [${lo}, ${cap}]`);
      } else {
        const bound = r * Math.min(10000, 1000 * 2 ** late++);
        assert.ok(Math.abs(d - bound) <= 1, `late attempt ${late} at ${at}: ${d} vs ${bound}`);
      }
      at += d;
    });
    assert.ok(at - delays[delays.length - 1] < 60000 && delays.every((d) => d <= 10000));
    h.client.close();
  }
});

// Closes every socket made before `until`, as a path to the nodes that
// is down does (the attempt fails at once), and opens the first one made
// after; returns when that one was made.
async function outage(h, until) {
  for (;;) {
    const n = h.ws.sockets.length;
    await h.clock.advance(0);
    for (let i = 0; i < 1000 && h.ws.sockets.length === n; i++) {
      const next = h.clock.next(); // timer to timer: no need to step every ms
      if (!next) break;
      await h.clock.advance(next.at - h.clock.t);
    }
    if (h.ws.sockets.length === n) throw new Error("no reconnect attempt");
    if (h.clock.t >= until) {
      h.ws.last.open();
      h.ws.last.recv(hello());
      await flush();
      return h.clock.t;
    }
    h.ws.last.serverClose(1006);
  }
}

// A seeded generator (mulberry32): many jitter draws, reproducible.
function seeded(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

test("every outage shorter than grace - 2 s ends in a reconnect inside the grace, within 1 s of its end", async () => {
  let runs = 0;
  for (const grace of [3000, 12000, 30000]) {
    for (const random of [() => 0.999, () => 0.001, seeded(grace), seeded(grace + 1)]) {
      for (let outageMs = 0; outageMs < grace - 2000; outageMs += 250) {
        const h = setup({ random });
        await open(h, { offline_grace_ms: grace });
        const t0 = h.clock.t;
        h.ws.last.serverClose(1006);
        const back = (await outage(h, t0 + outageMs)) - t0;
        assert.ok(back < grace - 1000, `grace ${grace}, outage ${outageMs}: back at ${back}`);
        assert.ok(back <= outageMs + 1000, `grace ${grace}, outage ${outageMs}: back at ${back}, over 1 s after the outage`);
        h.client.close();
        runs++;
      }
    }
  }
  assert.ok(runs > 500, String(runs));
});

test("the grace comes from hello: 12 s until one says otherwise", async () => {
  const h = setup({ random: () => 0.999 });
  await open(h); // no offline_grace_ms: the default
  const t0 = h.clock.t;
  h.ws.last.serverClose(1006);
  const back = (await outage(h, t0 + 9900)) - t0;
  assert.ok(back <= 10900, String(back));
});

test("backoff resets once a connection stayed open after hello", async () => {
  const h = setup({ random: () => 0.999 });
  await open(h);
  await delayAfterClose(h, 1006);
  await delayAfterClose(h, 1006);
  const third = await delayAfterClose(h, 1006); // ~1 s: the grace's short retries
  assert.ok(third > 900 && third <= 1000, String(third));
  h.ws.last.open();
  h.ws.last.recv(hello());
  await h.clock.advance(5000);
  assert.ok((await delayAfterClose(h, 1006)) <= 500);
});

test("close codes: 1012 and 1001 at once, 1008 at least 5 s, 4002 fresh token at once", async () => {
  const tokens = [];
  const h = setup({ random: () => 0.999, getToken: async (o) => { tokens.push(o.fresh); return "h.p.t" + tokens.length; } });
  await open(h);
  assert.ok((await delayAfterClose(h, 1012)) <= 250);
  h.ws.last.open(); h.ws.last.recv(hello());
  assert.ok((await delayAfterClose(h, 1001)) <= 250);
  h.ws.last.open(); h.ws.last.recv(hello());
  assert.ok((await delayAfterClose(h, 1008)) >= 5000);
  h.ws.last.open(); h.ws.last.recv(hello());
  tokens.length = 0;
  assert.equal(await delayAfterClose(h, 4002), 0);
  assert.deepEqual(tokens, [true], "4002: getToken asked for a fresh token");
  assert.deepEqual(h.ws.last.protocols, ["presence.v1", "bearer.h.p.t1"]);
});

test("a connection that fails before hello asks for a fresh token", async () => {
  const tokens = [];
  const h = setup({ getToken: async (o) => { tokens.push(o.fresh); return "h.p.t"; } });
  await h.clock.advance(0);
  h.ws.last.serverClose(1006); // a 401 looks like this
  await h.clock.advance(1000);
  assert.deepEqual(tokens, [false, true]);
});

test("4001: status closed, error session_taken, no reconnect; rooms end", async () => {
  const h = setup();
  const s = await open(h);
  const room = h.client.room("r");
  answerJoin(s, "r", [{ user: "u1", sessions: [] }]);
  s.serverClose(4001);
  await h.clock.advance(60000);
  assert.equal(h.ws.sockets.length, 1);
  assert.equal(h.client.status, "closed");
  assert.deepEqual(h.errors.map((e) => e.code), ["session_taken"]);
  assert.equal(room.status, "left");
  assert.deepEqual(room.members(), []);
});

test("close(): status closed, no reconnect, socket closed", async () => {
  const h = setup();
  const s = await open(h);
  h.client.close();
  assert.equal(h.client.status, "closed");
  assert.equal(s.closedByClient.code, 1000);
  await h.clock.advance(60000);
  assert.equal(h.ws.sockets.length, 1);
  assert.equal(h.clock.timers.size, 0, "no timer left behind");
});

test("window online: retry at once instead of waiting out the backoff", async () => {
  const listeners = {};
  const win = { addEventListener: (t, f) => { listeners[t] = f; }, removeEventListener: (t) => { delete listeners[t]; } };
  const h = setup({ window: win, random: () => 0.999 });
  await open(h);
  for (let i = 0; i < 5; i++) await delayAfterClose(h, 1006);
  h.ws.last.serverClose(1006); // next delay would be ~10 s
  await h.clock.advance(10);
  const n = h.ws.sockets.length;
  listeners.online();
  await flush();
  assert.equal(h.ws.sockets.length, n + 1);
  h.client.close();
  assert.equal(listeners.online, undefined);
});

test("ping: app-level ping every interval; no answer within the timeout -> reconnect", async () => {
  const h = setup({ pingIntervalMs: 15000, pingTimeoutMs: 10000 });
  const s = await open(h);
  await h.clock.advance(15000);
  const p = s.last("ping");
  assert.ok(p && p.ref);
  s.recv({ type: "pong", ref: p.ref }); // alive
  await h.clock.advance(15000);
  assert.equal(s.frames("ping").length, 2);
  await h.clock.advance(9999);
  assert.equal(h.ws.sockets.length, 1);
  await h.clock.advance(1);
  assert.ok(s.closedByClient, "dead socket closed");
  assert.equal(h.client.status, "reconnecting");
  await h.clock.advance(1000);
  assert.equal(h.ws.sockets.length, 2);
});

test("client.ping() resolves with the round trip; rejects when not connected", async () => {
  const h = setup();
  await assert.rejects(h.client.ping(), { code: "disconnected" });
  const s = await open(h);
  const p = h.client.ping();
  await h.clock.advance(30);
  s.recv({ type: "pong", ref: s.last("ping").ref });
  assert.equal(await p, 30);
});

test("refresh: scheduled ahead of token_expires, rescheduled from refreshed, retried after invalid_token", async () => {
  const tokens = [];
  const h = setup({ pingIntervalMs: 1e9, getToken: async (o) => { tokens.push(o.fresh); return "h.p.tok" + tokens.length; } });
  const exp = new Date(h.clock.t + 3600_000).toISOString();
  const s = await open(h, { token_expires: exp });
  await h.clock.advance(3540_000 - 1);
  assert.equal(s.frames("refresh").length, 0);
  await h.clock.advance(1); // a minute before
  const r = s.last("refresh");
  assert.equal(r.token, "h.p.tok2");
  assert.deepEqual(tokens, [false, true]);
  // Short token: refresh at a tenth of its remaining life before it.
  s.recv({ type: "refreshed", ref: r.ref, token_expires: new Date(h.clock.t + 100_000).toISOString() });
  await h.clock.advance(89_999);
  assert.equal(s.frames("refresh").length, 1);
  await h.clock.advance(1);
  const r2 = s.last("refresh");
  assert.equal(s.frames("refresh").length, 2);
  s.recv({ type: "error", code: "invalid_token", message: "expired", ref: r2.ref });
  assert.equal(h.errors.at(-1).code, "invalid_token");
  await h.clock.advance(5000);
  assert.equal(s.frames("refresh").length, 3, "retried a little later");
});

test("pacing: a reconnect rejoining 32 rooms and re-sending states never trips the server's limiter", async () => {
  const h = setup({ pingIntervalMs: 1e9 });
  let s = await open(h);
  const rooms = [];
  for (let i = 0; i < 32; i++) rooms.push(h.client.room("room" + i));
  const settle = async (sock) => {
    // Answer joins as they arrive; drive time until everything went out.
    for (let t = 0; t < 20000; t += 10) {
      for (const j of sock.frames("join")) if (!j.answered) { j.answered = true; answerJoin(sock, j.room, [], { seq: 1 }); }
      await h.clock.advance(10);
    }
  };
  await settle(s);
  rooms.forEach((r, i) => r.setState({ n: i }));
  await settle(s);
  for (const st of s.frames("state")) s.recv({ type: "state_set", ref: st.ref, room: st.room });
  s.serverClose(1012);
  await h.clock.advance(300);
  s = h.ws.last;
  s.open();
  s.recv(hello());
  await settle(s);
  assert.equal(s.frames("join").length, 32);
  assert.equal(s.frames("state").length, 32);
  // The server's bucket: frame_burst 20, frame_rate 10/s, starting full.
  let tokens = 20, last = s.sent[0].at;
  for (const { at } of s.sent) {
    tokens = Math.min(20, tokens + ((at - last) * 10) / 1000);
    last = at;
    tokens -= 1;
    assert.ok(tokens >= 0, "would be rate_limited");
  }
});

test("reconnect: rooms rejoin (status rejoining, view kept), state re-sent; no diff for unchanged members", async () => {
  const h = setup();
  let s = await open(h);
  const room = h.client.room("r", { detail: "sessions" });
  const statuses = [];
  room.on("status", (st) => statuses.push(st));
  answerJoin(s, "r", [{ user: "u1", sessions: [{ id: "s1" }] }], { seq: 1 });
  const done = room.setState({ status: "away" });
  const st = s.last("state");
  assert.deepEqual(st, { type: "state", room: "r", state: { status: "away" }, ref: st.ref });
  s.recv(eventFrame("r", 2, { kind: "update", reason: "state", user: "u1", session: "s1", state: { status: "away" } }));
  s.recv({ type: "state_set", ref: st.ref, room: "r" });
  await done;
  const view = room.members();
  const events = [];
  for (const t of ["join", "leave", "update"]) room.on(t, (m) => events.push(t + ":" + m.user));
  s.serverClose(1006);
  await flush();
  assert.equal(room.status, "rejoining");
  assert.equal(room.members(), view, "the last view stays while rejoining");
  await h.clock.advance(1000);
  s = h.ws.last;
  s.open();
  s.recv(hello());
  assert.deepEqual(s.frames().map((f) => f.type), ["join"]);
  assert.equal(s.last("join").detail, "sessions");
  answerJoin(s, "r", [{ user: "u1", sessions: [{ id: "s1", state: { status: "away" } }] }], { seq: 7 });
  assert.deepEqual(s.frames().map((f) => f.type), ["join", "state"]);
  assert.deepEqual(s.last("state").state, { status: "away" });
  assert.equal(room.status, "joined");
  assert.deepEqual(statuses, ["joined", "rejoining", "joined"]);
  assert.deepEqual(events, []);
  assert.equal(room.members(), view, "same view, same reference");
});

test("state null is not re-sent after a reconnect", async () => {
  const h = setup();
  let s = await open(h);
  const room = h.client.room("r");
  answerJoin(s, "r", []);
  s.serverClose(1012);
  await h.clock.advance(300);
  s = h.ws.last;
  s.open(); s.recv(hello());
  answerJoin(s, "r", []);
  assert.deepEqual(s.frames().map((f) => f.type), ["join"]);
  assert.equal(room.status, "joined");
});
