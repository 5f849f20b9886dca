// Connects that fail: a token that is not a JWT, getToken throwing,
// closes before hello (4401 and the unreadable 1006). Each surfaces once
// per run of failures, and the client backs off or stops as documented.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setup, open, hello, flush } from "./helpers.js";

const HTML_404 = "<!DOCTYPE HTML PUBLIC \"-//IETF//DTD HTML 2.0//EN\">\n<html><head><title>404 Not Found</title></head></html>\n";

// Runs the fake clock for ms, timer to timer.
async function run(h, ms) {
  const end = h.clock.t + ms;
  for (;;) {
    const next = h.clock.next(end);
    if (!next) break;
    await h.clock.advance(next.at - h.clock.t);
  }
  await h.clock.advance(end - h.clock.t);
}

// Closes every socket the client makes, before hello, with code and
// reason, for ms of fake time. Returns the times the sockets were made.
async function refuseAll(h, ms, code, reason = "") {
  const end = h.clock.t + ms;
  const made = [];
  let seen = h.ws.sockets.length;
  await h.clock.advance(0);
  while (h.clock.t < end) {
    if (h.ws.sockets.length > seen) {
      for (; seen < h.ws.sockets.length; seen++) made.push(h.clock.t);
      h.ws.last.serverClose(code, reason);
      await flush();
      continue;
    }
    const next = h.clock.next(end);
    if (!next) break;
    await h.clock.advance(next.at - h.clock.t);
  }
  return made;
}

test("a token that is not a JWT (an HTML 404 page as text): token_not_jwt once, no socket ever, backoff with fresh tokens", async () => {
  const calls = [];
  let h = null; // the first call comes from createClient, before setup returns: at the clock's start
  h = setup({ random: () => 0.999, getToken: async (o) => { calls.push({ at: h ? h.clock.t : undefined, fresh: o.fresh }); return HTML_404; } });
  calls[0].at = h.clock.t;
  await run(h, 60000);
  assert.equal(h.ws.sockets.length, 0, "no WebSocket built: no bearer.<!DOCTYPE… subprotocol");
  assert.deepEqual(h.errors.map((e) => e.code), ["token_not_jwt"], "surfaces once");
  const e = h.errors[0];
  assert.match(e.message, /HTML page/);
  assert.match(e.message, /r\.ok/);
  assert.match(e.message, /"<!DOCTYPE HTML PUBLIC/);
  assert.ok(e.hint);
  assert.equal(h.client.status, "connecting");
  // The tries back off as before the first hello: random * min(10 s, 500 ms * 2^n).
  assert.ok(calls.length >= 8, String(calls.length));
  assert.deepEqual(calls.slice(0, 3).map((c) => c.fresh), [false, true, true]);
  for (let i = 1; i < calls.length; i++) {
    const want = 0.999 * Math.min(10000, 500 * 2 ** (i - 1));
    assert.ok(Math.abs(calls[i].at - calls[i - 1].at - want) <= 1, `try ${i}: ${calls[i].at - calls[i - 1].at} vs ${want}`);
  }
  h.client.close();
});

test("token_not_jwt: JSON, a number, plain text; a JWT with a trailing newline is trimmed and taken", async () => {
  for (const [result, re] of [['{"token":"eyJhbGciOiJIUzI1NiJ9.e30.x"}', /JSON.*\.token/], [42, /number/], ["not-a-token", /not a JWT/], [["a.b.c"], /array/]]) {
    const h = setup({ getToken: async () => result });
    await h.clock.advance(0);
    assert.equal(h.ws.sockets.length, 0);
    assert.equal(h.errors.length, 1);
    assert.equal(h.errors[0].code, "token_not_jwt");
    assert.match(h.errors[0].message, re);
    h.client.close();
  }
  const h = setup({ getToken: async () => "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1MSJ9.c2ln\n" });
  await h.clock.advance(0);
  assert.deepEqual(h.ws.last.protocols, ["presence.v1", "bearer.eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1MSJ9.c2ln"]);
  assert.deepEqual(h.errors, []);
});

test("getToken failing (a 404 with r.ok checked): token_error once per run, again after a hello", async () => {
  let fail = true;
  const h = setup({ getToken: async () => { if (fail) throw new Error("token endpoint answered 404"); return "h.p.s"; } });
  await run(h, 30000);
  assert.deepEqual(h.errors.map((e) => e.code), ["token_error"]);
  assert.match(h.errors[0].message, /404/);
  assert.equal(h.ws.sockets.length, 0);
  fail = false;
  await run(h, 10000);
  const s = h.ws.last;
  s.open();
  s.recv(hello());
  await flush();
  assert.equal(h.client.status, "open");
  fail = true;
  s.serverClose(1006);
  await run(h, 30000);
  assert.deepEqual(h.errors.map((e) => e.code), ["token_error", "token_error"], "a new run reports again");
});

test("closes before hello: connect_refused once, at the third in a row, with the close code and a hint; backoff goes on", async () => {
  const h = setup({ random: () => 0.999 });
  const made = await refuseAll(h, 60000, 1006);
  assert.ok(made.length >= 8, String(made.length));
  assert.deepEqual(h.errors.map((e) => e.code), ["connect_refused"]);
  const e = h.errors[0];
  assert.equal(e.closeCode, 1006);
  assert.match(e.message, /3 connections in a row closed before the node's hello \(close 1006\)/);
  assert.match(e.hint, /token endpoint/);
  assert.match(e.hint, /user option/);
  assert.equal(h.client.status, "connecting");
  for (let i = 1; i < made.length; i++) {
    const want = 0.999 * Math.min(10000, 500 * 2 ** (i - 1));
    assert.ok(Math.abs(made[i] - made[i - 1] - want) <= 1, `try ${i}: ${made[i] - made[i - 1]} vs ${want}`);
  }
  // Two closes are not enough.
  const h2 = setup();
  await refuseAll(h2, 600, 1006);
  assert.equal(h2.ws.sockets.length, 2);
  assert.deepEqual(h2.errors, []);
});

test("a drop's blip is not a refusal: no connect_refused inside the grace, once past it", async () => {
  const h = setup({ random: () => 0.999 });
  await open(h, { offline_grace_ms: 5000 });
  const t0 = h.clock.t;
  h.ws.last.serverClose(1006);
  await refuseAll(h, 4900, 1006);
  assert.ok(h.ws.sockets.length >= 5, String(h.ws.sockets.length));
  assert.deepEqual(h.errors, [], "inside the grace: status reconnecting says it");
  assert.equal(h.client.status, "reconnecting");
  await refuseAll(h, 20000, 1006);
  assert.deepEqual(h.errors.map((e) => e.code), ["connect_refused"]);
  assert.ok(h.clock.t - t0 >= 5000);
});

test("4401 without getToken (a dev node, no user): unauthorized at once with the node's reason, then closed", async () => {
  const h = setup();
  const room = h.client.room("r");
  const reason = "dev mode needs a token (GET /dev/token?user=) or ?user=<user id>: presence: invalid user id \"\": must not be empty";
  await h.clock.advance(0);
  h.ws.last.serverClose(4401, reason);
  await run(h, 60000);
  assert.equal(h.ws.sockets.length, 1, "no retry: nothing the client could send would do");
  assert.equal(h.client.status, "closed");
  assert.equal(room.status, "left");
  assert.deepEqual(h.errors.map((e) => e.code), ["unauthorized"]);
  const e = h.errors[0];
  assert.equal(e.closeCode, 4401);
  assert.equal(e.closeReason, reason);
  assert.ok(e.message.includes(reason) && e.message.includes("close 4401"), e.message);
  assert.match(e.hint, /user option/);
  assert.match(e.hint, /\/dev\/token/);
});

test("4401 with getToken: retried with a fresh token; a second in a row is unauthorized, once; backoff goes on", async () => {
  const calls = [];
  const h = setup({ getToken: async (o) => { calls.push(o.fresh); return "h.p.s"; } });
  await h.clock.advance(0);
  h.ws.last.serverClose(4401, "token is expired");
  await run(h, 1000);
  assert.equal(h.ws.sockets.length, 2);
  assert.deepEqual(calls, [false, true], "the next connect asks a fresh token");
  assert.deepEqual(h.errors, [], "one refusal may be a stale token");
  const made = await refuseAll(h, 60000, 4401, "token signature is invalid or its algorithm is not accepted");
  assert.ok(made.length >= 6, String(made.length));
  assert.deepEqual(h.errors.map((e) => e.code), ["unauthorized"]);
  assert.equal(h.errors[0].closeReason, "token signature is invalid or its algorithm is not accepted");
  assert.match(h.errors[0].hint, /fresh token was refused too/);
  assert.ok(calls.slice(1).every((f) => f === true));
  assert.equal(h.client.status, "connecting");
  // getToken giving nothing to a node that needs a token: the hint says so.
  const h3 = setup({ getToken: async () => undefined });
  await refuseAll(h3, 3000, 4401, "no token: send Authorization: Bearer <jwt>, a \"bearer.<jwt>\" subprotocol entry, or ?access_token=");
  assert.deepEqual(h3.errors.map((e) => e.code), ["unauthorized"]);
  assert.match(h3.errors[0].hint, /getToken returned no token/);
  // A stale token refused once, then a good one: nothing to report.
  const h2 = setup({ getToken: async () => "h.p.s" });
  await h2.clock.advance(0);
  h2.ws.last.serverClose(4401, "token is expired");
  await run(h2, 1000);
  h2.ws.last.open();
  h2.ws.last.recv(hello());
  await flush();
  assert.equal(h2.client.status, "open");
  assert.deepEqual(h2.errors, []);
});

test("a refresh whose getToken returns no JWT: token_not_jwt, no refresh frame, tried again", async () => {
  let n = 0;
  const h = setup({ pingIntervalMs: 1e9, getToken: async () => (n++ === 0 ? "h.p.s" : HTML_404) });
  const s = await open(h, { token_expires: new Date(h.clock.t + 100_000).toISOString() });
  await h.clock.advance(90_000);
  assert.equal(s.frames("refresh").length, 0);
  assert.deepEqual(h.errors.map((e) => e.code), ["token_not_jwt"]);
  await h.clock.advance(5000);
  assert.ok(n >= 3, "tried again");
});

test("an error nobody listens to is logged with console.error, not dropped", async () => {
  const logged = [];
  const orig = console.error;
  console.error = (...a) => logged.push(a.join(" "));
  try {
    const h = setup({ getToken: async () => HTML_404 });
    h.client.off("error", h.client._listeners.get("error").values().next().value);
    await h.clock.advance(0);
    h.client.close();
  } finally {
    console.error = orig;
  }
  assert.equal(logged.length, 1);
  assert.match(logged[0], /^presence: token_not_jwt: getToken returned an HTML page/);
});
