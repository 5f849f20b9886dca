// The error codes of client.d.ts and README's "Errors" are exactly the
// codes client.js makes and the node sends (protocol/protocol.go).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

const read = (p) => readFileSync(new URL(p, import.meta.url), "utf8");
const sorted = (set) => [...set].sort();

// Codes client.js puts in a PresenceError: every `new PresenceError("code"`,
// and errorFromFrame's fallback for a frame without one.
function clientCodes(src) {
  const codes = new Set();
  for (const m of src.matchAll(/PresenceError\(\s*(?:typeof f\.code === "string" \? f\.code : )?"([a-z_]+)"/g)) codes.add(m[1]);
  return codes;
}

function nodeCodes(src) {
  return new Set([...src.matchAll(/ErrorCode = "([a-z_]+)"/g)].map((m) => m[1]));
}

// The string literals of `export type name = …;`, comments left out.
function unionOf(dts, name) {
  const m = new RegExp(`export type ${name} =([^;]*);`).exec(dts.replace(/\/\*[\s\S]*?\*\//g, ""));
  assert.ok(m, `client.d.ts declares ${name}`);
  return new Set([...m[1].matchAll(/"([a-z_]+)"/g)].map((x) => x[1]));
}

test("client.d.ts: ClientErrorCode is what client.js makes, NodeErrorCode what the node sends", () => {
  const dts = read("../client.d.ts");
  const fromClient = clientCodes(read("../client.js"));
  const fromNode = nodeCodes(read("../../../protocol/protocol.go"));
  assert.ok(fromClient.size >= 15 && fromClient.has("connect_refused") && fromClient.has("unknown"), sorted(fromClient).join(" "));
  assert.ok(fromNode.size >= 15 && fromNode.has("rate_limited"), sorted(fromNode).join(" "));
  assert.deepEqual(sorted(unionOf(dts, "ClientErrorCode")), sorted(fromClient));
  assert.deepEqual(sorted(unionOf(dts, "NodeErrorCode")), sorted(fromNode));
  assert.match(dts, /export type ErrorCode = NodeErrorCode \| ClientErrorCode;/);
  assert.match(dts, /readonly code: ErrorCode;/);
});

test("README's Errors section names every code", () => {
  const readme = read("../README.md");
  const i = readme.indexOf("\n## Errors\n");
  assert.ok(i >= 0, "README has an Errors section");
  const section = readme.slice(i, readme.indexOf("\n## ", i + 1));
  const codes = new Set([...clientCodes(read("../client.js")), ...nodeCodes(read("../../../protocol/protocol.go"))]);
  const missing = sorted(codes).filter((c) => !section.includes("`" + c + "`"));
  assert.deepEqual(missing, []);
});
