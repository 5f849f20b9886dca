// Type-checked against client.d.ts by `npm run typecheck` (never run).
import { createClient, PresenceError, type ErrorCode, type Member, type Room, type CountRoom, type CountSnapshot, type Watch, type WatchStatus, type ClientStatus } from "../client.js";

const client = createClient({
  url: "https://node.example/v1/ws",
  getToken: async ({ fresh }) => (fresh ? "new.jwt" : "cached.jwt"),
});
const offStatus = client.on("status", (s: ClientStatus) => console.log(s));
client.on("error", (e: PresenceError) => console.log(e.code, e.retryAfterMs));
client.on("error", (e) => {
  const code: ErrorCode = e.code;
  switch (code) {
    case "unauthorized": case "connect_refused": console.log(e.closeCode, e.closeReason, e.hint); break;
    case "token_not_jwt": case "token_error": console.log(e.hint); break;
    case "rate_limited": break;
  }
});
const grace: number = client.offlineGraceMs;
console.log(grace);
offStatus();

const room: Room = client.room("room42", { detail: "sessions" });
room.on("sync", (members) => console.log(members.length));
room.on("join", (m: Member, c) => console.log(m.user, c.reason));
room.on("leave", (m) => console.log(m.user));
room.on("update", (m, change) => console.log(m.sessions.map((s) => s.id), change.session, change.state, change.reason));
room.on("status", (s) => { if (s === "revoked") console.log("revoked"); });
const unsubscribe = room.subscribe(() => {
  const snap: readonly Member[] = room.getSnapshot();
  console.log(snap[0]?.sessions[0]?.state);
});
unsubscribe();

const lobby: CountRoom = client.room("lobby", { view: "count", present: false });
lobby.on("count", (n: number, c) => console.log(n, c.reason));
const countSnap: CountSnapshot | null = lobby.getSnapshot();
const n: number | undefined = lobby.count();
console.log(countSnap?.count, n, lobby.view);
const quiet: Room = client.room("quiet", { batch: false, present: false, view: "members" });
console.log(quiet.present, quiet.view);

const dots: Watch = client.watch("lobby", ["u_1", "u_2"]);
dots.on("join", (m: Member, c) => console.log(m.user, c.reason));
dots.on("status", (s: WatchStatus) => { if (s === "revoked") console.log("revoked"); });
const offDots = dots.subscribe(() => console.log(dots.getSnapshot().length, dots.members()[0]?.user));
offDots();
console.log(client.watches().length, client.rooms().length, dots.users, dots.total);

async function main(): Promise<void> {
  await dots.ready;
  await dots.update(["u_3"]);
  await dots.close();
  await room.setState({ status: "away", since: 3 });
  await room.setState(null);
  const rtt: number = await client.ping();
  console.log(rtt, client.sessionId, client.user, client.limits.frame_rate, room.complete, room.region);
  await room.leave();
  client.close();
}
void main;

// @ts-expect-error: status is read-only
room.status = "joined";
// @ts-expect-error: detail takes only "sessions"
client.room("x", { detail: "all" });
// @ts-expect-error: detail does not go with view count
client.room("y", { view: "count", detail: "sessions" });
// @ts-expect-error: a count room has no members()
lobby.members();
// @ts-expect-error: watch takes a list of user ids
client.watch("lobby", "u_1");
