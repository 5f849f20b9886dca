// Closes by the server API: 4003 (disconnected) and 4004 (revoked).
import { test } from "node:test";
import assert from "node:assert/strict";
import { setup, open, answerJoin } from "./helpers.js";

test("4004: status closed, error revoked with revokedUntil, no reconnect; rooms end", async () => {
  const h = setup();
  const s = await open(h);
  const room = h.client.room("r");
  answerJoin(s, "r", [{ user: "u1", sessions: [] }]);
  s.serverClose(4004, "revoked until 2030-01-02T03:04:05Z");
  await h.clock.advance(60000);
  assert.equal(h.ws.sockets.length, 1, "no reconnect");
  assert.equal(h.client.status, "closed");
  assert.deepEqual(h.errors.map((e) => e.code), ["revoked"]);
  assert.equal(h.errors[0].revokedUntil.toISOString(), "2030-01-02T03:04:05.000Z");
  assert.equal(room.status, "left");
});

test("4004 with an unreadable reason: still final, no revokedUntil", async () => {
  const h = setup();
  const s = await open(h);
  s.serverClose(4004, "gone");
  await h.clock.advance(60000);
  assert.equal(h.ws.sockets.length, 1);
  assert.equal(h.errors[0].code, "revoked");
  assert.equal(h.errors[0].revokedUntil, undefined);
});

test("4003: reconnects after the backoff with a fresh token", async () => {
  const calls = [];
  const h = setup({ getToken: async (o) => { calls.push(o); return "jwt.a.b"; } });
  const s = await open(h);
  s.serverClose(4003, "disconnected");
  await h.clock.advance(0);
  assert.equal(h.ws.sockets.length, 1, "not at once");
  await h.clock.advance(1000); // backoff: random 0.5 * 500 ms
  assert.equal(h.ws.sockets.length, 2);
  assert.deepEqual(calls, [{ fresh: false }, { fresh: true }]);
  assert.deepEqual(h.errors, []);
});
