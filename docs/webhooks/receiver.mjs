// A presence webhook receiver in Node, no packages: verifies each
// delivery, dedupes by event id, folds each room's events in (epoch, seq)
// order and takes a fresh snapshot from the HTTP API at a resync marker.
// node docs/webhooks/receiver.mjs (env: WEBHOOK_SECRET, PRESENCE_API,
// PRESENCE_KEY, PORT); GET /state shows the rooms' members as folded.
import { createServer } from "node:http";
import { verifyWebhook } from "./verify.mjs";

const { WEBHOOK_SECRET: secret, PRESENCE_API: api, PRESENCE_KEY: key, PORT = "0" } = process.env;
const seen = new Set(); // event and marker ids applied
const rooms = new Map(); // room -> { epoch, seq, members: Set }
const counts = { deliveries: 0, duplicates: 0, rejected: 0, resyncs: 0 };

const above = (r, e) => !r || e.epoch > r.epoch || (e.epoch === r.epoch && e.seq > r.seq);

async function snapshot(room) {
  const members = new Set();
  let page;
  for (let offset = 0; !page || offset < page.total; offset += page.members.length) {
    const url = `${api}/v1/rooms/${encodeURIComponent(room)}/members?offset=${offset}&limit=100`;
    const res = await fetch(url, { headers: { authorization: `Bearer ${key}` } });
    if (!res.ok) throw new Error(`snapshot ${room}: ${res.status}`);
    page = await res.json();
    page.members.forEach((m) => members.add(m.user));
    if (page.members.length === 0) break;
  }
  return { epoch: page.epoch, seq: page.room_seq, members };
}

async function apply(e) {
  if (seen.has(e.id)) return counts.duplicates++;
  if (e.kind === "resync") {
    counts.resyncs++;
    rooms.set(e.room, await snapshot(e.room));
  } else if (above(rooms.get(e.room), e)) {
    const r = rooms.get(e.room) ?? { members: new Set() };
    if (e.kind === "online") r.members.add(e.user);
    if (e.kind === "offline") r.members.delete(e.user);
    rooms.set(e.room, { ...r, epoch: e.epoch, seq: e.seq });
  }
  seen.add(e.id);
}

const server = createServer(async (req, res) => {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const body = Buffer.concat(chunks);
  if (req.method === "GET") {
    const state = Object.fromEntries([...rooms].map(([room, r]) => [room, [...r.members].sort()]));
    return res.end(JSON.stringify({ rooms: state, ...counts }));
  }
  if (!verifyWebhook(secret, req.headers, body)) {
    counts.rejected++;
    return res.writeHead(400).end();
  }
  try {
    for (const e of JSON.parse(body).events) await apply(e);
  } catch (err) {
    return res.writeHead(503).end(String(err)); // retried: the same ids come again
  }
  counts.deliveries++;
  res.writeHead(204).end();
});
server.listen(Number(PORT), "127.0.0.1", () => console.log(`listening ${server.address().port}`));
