// Session ids per tab and duplicated tabs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setup, flush } from "./helpers.js";

function memoryStorage(init = {}) {
  const m = new Map(Object.entries(init));
  return { getItem: (k) => (m.has(k) ? m.get(k) : null), setItem: (k, v) => m.set(k, String(v)), map: m };
}

// A bus shared by "tabs"; each tab gets its own BroadcastChannel constructor.
// Like the real one, a message reaches every other channel object of that name.
function bus() {
  const chans = new Set();
  return function tab() {
    return class FakeBroadcastChannel {
      constructor(name) { this.name = name; chans.add(this); }
      postMessage(data) {
        const copy = structuredClone(data);
        for (const c of chans) if (c !== this && c.name === this.name && c.onmessage) queueMicrotask(() => c.onmessage({ data: copy }));
      }
      close() { chans.delete(this); }
    };
  };
}

const ID = /^[A-Za-z0-9_-]{1,64}$/;

test("a new tab makes an id, stores it, and connects with it at once", async () => {
  const storage = memoryStorage();
  const h = setup({ sessionId: undefined, storage, BroadcastChannel: bus()() });
  await flush();
  assert.match(h.client.sessionId, ID);
  assert.equal(storage.map.get("presence.session"), h.client.sessionId);
  assert.equal(new URL(h.ws.last.url).searchParams.get("session"), h.client.sessionId);
});

test("a reloaded tab keeps its stored id once nobody answers the announcement", async () => {
  const storage = memoryStorage({ "presence.session": "tab-3f9a" });
  const h = setup({ sessionId: undefined, storage, BroadcastChannel: bus()(), duplicateCheckMs: 120 });
  await h.clock.advance(119);
  assert.equal(h.ws.sockets.length, 0, "waits for an answer first");
  await h.clock.advance(1);
  assert.equal(h.ws.sockets.length, 1);
  assert.equal(h.client.sessionId, "tab-3f9a");
});

test("a duplicated tab gets an 'in use' answer and takes a new id", async () => {
  const b = bus();
  const first = setup({ sessionId: undefined, storage: memoryStorage({ "presence.session": "tab-3f9a" }), BroadcastChannel: b() });
  await first.clock.advance(200);
  assert.equal(first.client.sessionId, "tab-3f9a");
  const copied = memoryStorage({ "presence.session": "tab-3f9a" }); // sessionStorage copied by the browser
  const dup = setup({ sessionId: undefined, storage: copied, BroadcastChannel: b() });
  await flush();
  await dup.clock.advance(0);
  assert.notEqual(dup.client.sessionId, "tab-3f9a");
  assert.match(dup.client.sessionId, ID);
  assert.equal(copied.map.get("presence.session"), dup.client.sessionId);
  assert.equal(new URL(dup.ws.last.url).searchParams.get("session"), dup.client.sessionId);
  assert.equal(first.client.sessionId, "tab-3f9a", "the running tab keeps its id");
});

test("two tabs starting with the same id at once: exactly one keeps it", async () => {
  for (let i = 0; i < 20; i++) { // random nonces: both tie-break branches
    const b = bus();
    const a = setup({ sessionId: undefined, storage: memoryStorage({ "presence.session": "same" }), BroadcastChannel: b() });
    const c = setup({ sessionId: undefined, storage: memoryStorage({ "presence.session": "same" }), BroadcastChannel: b() });
    await flush();
    await a.clock.advance(200);
    await c.clock.advance(200);
    const kept = [a, c].filter((h) => h.client.sessionId === "same").length;
    assert.equal(kept, 1);
    a.client.close();
    c.client.close();
  }
});

test("an explicit sessionId skips storage and the channel", async () => {
  let made = 0;
  const storage = memoryStorage();
  const h = setup({ sessionId: "dev-1", storage, BroadcastChannel: class { constructor() { made++; } } });
  await flush();
  assert.equal(made, 0);
  assert.equal(storage.map.size, 0);
  assert.equal(new URL(h.ws.last.url).searchParams.get("session"), "dev-1");
  assert.throws(() => setup({ sessionId: "bad id!" }), TypeError);
});

test("clients in one tab share the tab's id and do not answer each other", async () => {
  const tab = bus()();
  const storage = memoryStorage({ "presence.session": "tab-1" });
  const a = setup({ sessionId: undefined, storage, BroadcastChannel: tab });
  await a.clock.advance(200);
  const b = setup({ sessionId: undefined, storage, BroadcastChannel: tab });
  await b.clock.advance(200);
  assert.equal(a.client.sessionId, "tab-1");
  assert.equal(b.client.sessionId, "tab-1");
});
