// The package as npm publishes it: `npm pack` builds the tarball, which is
// installed under a scratch node_modules and imported by its name, so the
// files list and the exports map are what a user gets.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkgDir = join(dirname(fileURLToPath(import.meta.url)), "..");

test("npm pack: the tarball holds the client, its types, README and LICENSE, and imports by name", async (t) => {
  const scratch = mkdtempSync(join(tmpdir(), "presence-pack-"));
  t.after(() => rmSync(scratch, { recursive: true, force: true }));
  const out = execFileSync("npm", ["pack", "--json", "--pack-destination", scratch], {
    cwd: pkgDir, encoding: "utf8", env: { ...process.env, npm_config_loglevel: "error" },
  });
  const [info] = JSON.parse(out);
  assert.deepEqual(info.files.map((f) => f.path).sort(),
    ["LICENSE", "README.md", "client.d.ts", "client.js", "package.json"]);

  const dest = join(scratch, "app", "node_modules", "@presence", "client");
  mkdirSync(dest, { recursive: true });
  execFileSync("tar", ["-xzf", join(scratch, info.filename), "-C", dest, "--strip-components=1"]);
  assert.ok(readdirSync(dest).includes("client.d.ts"));
  const app = join(scratch, "app", "main.mjs");
  writeFileSync(app, `export { createClient } from "@presence/client";\n`);
  const mod = await import(app);
  assert.equal(typeof mod.createClient, "function");
  assert.throws(() => mod.createClient({}), /createClient needs a url/);
});
