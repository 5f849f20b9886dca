// Package region keeps one region's presence in Redis: sessions with a TTL
// that only a live node refreshes, the offline grace, the reaper that turns
// expired entries into transitions, last seen, and the outbox that carries
// every transition to the bus even if its producer dies.
//
// # Keys
//
// Every key of room R carries the hash tag {R}, so all of a room lives in
// one Redis Cluster slot and each operation is one atomic script on it.
// The second column is the key's name in the Go code (roomKeys, keys.go)
// and in the Lua scripts (room_at, lua/lib.lua); this table is the one
// description of the schema.
//
//	presence:{R}      z   ZSET  user -> until, unix seconds, rounded up. A member
//	                          while until * 1000 >= now (ms).
//	presence:{R}:s    s   ZSET  "user:session" then a holder code -> expiry, unix
//	                          seconds (listpack stores it in 5 bytes, not 9; the
//	                          TTL is rounded up to a whole second). The code, 1
//	                          to 3 bytes outside the id alphabet (so the session
//	                          id ends where it starts, with no separator), names
//	                          the store holding it (see presence:holders); a
//	                          session has one entry, its holder's. A released
//	                          session keeps one with no code, "user:session",
//	                          scored at the end of its grace: listed, with its
//	                          state, until then.
//	presence:{R}:g    g   ZSET  user -> when the user leaves, unix ms, after a
//	                          clean close of a session of theirs that no touch
//	                          of any of their sessions has followed: the end of
//	                          the offline grace, or later when a session of
//	                          theirs that a node holds goes stale later (see
//	                          Transitions). The departure keeps to that ms;
//	                          until in z is it rounded up.
//	presence:{R}:st   st  HASH  "user:session" -> state JSON (the test format 3:
//	                          '~' then the JSON). It belongs to the
//	                          session, whichever node holds it.
//	presence:{R}:mv   mv  ZSET  entry of s -> ms: tombstones of entries
//	                          taken over from, or released by, that holder, so
//	                          its late refresh cannot bring the session back; a
//	                          claim of the holder lifts its own. The key expires
//	                          a TTL after the last one was written.
//	presence:{R}:m    m   HASH  seq (the last event's), epoch (when the room's
//	                          numbering began), jsroom, jsseq (the highest
//	                          delivered seq and its stream sequence).
//	presence:{R}:o    o   LIST  events not yet acknowledged by the publisher, in
//	                          the entry format of outbox.go.
//	presence:{R}:u    u   ZSET  score 0, "user sid1code1 ..." ("user" alone in
//	                          the grace): the member index, only in rooms of more
//	                          than 512 sessions, in user id order. While it exists
//	                          it lists exactly the users of z, each with their
//	                          entries of s (dead ones included); releases, state
//	                          changes and snapshot pages read it instead of the
//	                          whole room.
//	presence:reap         ZSET  room -> the first ms it may hold something
//	                          overdue, never later (on a cluster, one per slot:
//	                          presence:reap:{tag}, in that slot). KEYS[1] of the
//	                          writing scripts. It also holds ":inc:<ms>" at +inf,
//	                          the incarnation of its slot's data: written when
//	                          missing, so a new value means Redis lost the data.
//	presence:reap:chg     ZSET  "room:user" or "room:" then an entry of s added
//	                          -> ms: the change log (on a cluster, one
//	                          per slot: presence:reap:{tag}:chg). Every step that
//	                          changes a member's listed sessions, their states or
//	                          the membership marks the member, stamped never below
//	                          the log's highest; the cross-region publisher reads
//	                          the marks since its last read (Store.Changes) instead
//	                          of the region. Kept only while read: its reader
//	                          creates it, trims it to ChangesKeep and sets it to
//	                          expire after that; a step finds no log and writes
//	                          none when nobody reads it.
//	presence:reap:g       SET   the z keys (presence:{R}) of the rooms that may have a
//	                          departure pending in g (on a cluster, one per slot:
//	                          presence:reap:{tag}:g). A release adds its room; a
//	                          refresh that finds the room's g empty removes it. Every room with a non-empty g is
//	                          in it, so the heartbeat looks at g only for those:
//	                          one lookup per script call.
//	presence:reap:w       HASH  holder code -> when that holder's last touch
//	                          (heartbeat or join) ran in the slot, Redis ms (on
//	                          a cluster, one per slot: presence:reap:{tag}:w).
//	                          Releases and the reaper judge by it, to the ms,
//	                          whether a session's holder has gone silent (see
//	                          Transitions). One field per code ever used,
//	                          never removed: every code that ends an entry
//	                          of s is in it (only touch writes coded entries,
//	                          its code first), so a claim in a slot of few
//	                          codes looks a session's entries up by name.
//	presence:reap:{tag}:swept  STRING, cluster only: a master's sweep is
//	                          claimed (PX 4/5 of the reap interval).
//	presence:clock        HASH  seen, hold, from: the region's clock (clock.lua).
//	presence:holders      HASH  holder code -> "nonce|lease end ms|free from ms|name|format":
//	                          the codes' leases (hold.lua, holders.go). A code
//	                          goes to another store only from "free from" on,
//	                          a quarantine after its lease ended; name is the
//	                          holder's Options.Holder, for operators; format
//	                          the newest it reads (none: 2), which the
//	                          switch of formats checks. Its field "format"
//	                          (no code: id bytes) is the bar the switch
//	                          writes: no lease for a holder of an older
//	                          format. On a cluster, in whichever slot it
//	                          hashes to.
//	presence:seen:{N}     HASH  user -> last seen, unix seconds (N = crc32(user)
//	                          mod buckets).
//	presence:schema       STRING the format of the region's data, "2" (schema.go):
//	                          every store writes it; "Upgrading" says how it
//	                          moves to the next.
//	presence:revoked      ZSET  "user:room" ("user:" for every room) -> until, unix
//	                          ms: the users the server API barred (revoke.go);
//	                          written with the ended ones dropped, and expires
//	                          when the latest written ends. On a cluster, in
//	                          whichever slot it hashes to.
//
// "presence" is Options.Prefix. Room, user and session ids cannot contain
// ':' or '|'.
//
// # Upgrading
//
// Format 2 (holder codes, until in seconds) cannot read the data of the
// releases before it (entries "user:session:holder", until in ms): a
// member's until in ms would read as seconds far ahead, a ghost. Such a
// region moves to format 2 on an empty keyspace (presenced
// --redis-prefix). From format 2 on, a format changes by expand and
// contract, node by node, with nothing announced:
//
//   - Expand. A release of format N+1 reads formats N and N+1 and writes
//     the format presence:schema names. Its nodes run beside those of
//     the release of format N in a region of format N: the region keeps
//     being written in N, which both read. Releases that may run together
//     are exactly those two: the one of the region's format and the next,
//     which reads it; a release reads from format 2 (oldestFormat) to its
//     own (FormatVersion), and refuses any other at Preload with a
//     SchemaError (presenced exits).
//   - Switch. Once every node runs the new release, an operator runs
//     presenced upgrade --finish (FinishUpgrade, upgrade.go). It moves the
//     marker to N+1 only if no holder of presence:holders whose lease runs
//     reads an older format (every writing store holds a lease naming the
//     newest format it reads; a store's Close ends its lease; one that died
//     keeps it until it runs out, holdLease). The switch is a command, not
//     automatic when the last old node leaves, because it ends the rollback:
//     an operator who stops the rollout, or finds the new release wanting,
//     rolls the old release back in up to that moment, and decides when it
//     has passed. The check is one step with a bar (fence.lua): it finds
//     no such lease and bars the registry to older holders at once, so a
//     store of the old release that read the old marker just before gets
//     no lease after it, and every write needs one (hold.lua): nothing is
//     written in the old format once the marker moves. If the marker's
//     move then fails, the bar stays: old stores get no lease, new ones
//     still write the old format; run --finish again.
//   - Contract. Within a heartbeat every store reads the marker again
//     (pollFormat) and writes N+1; each session's data moves as its node's
//     next heartbeat rewrites it (touch.lua), and what no heartbeat
//     touches ends with its session. A store's refreshes move states only
//     for a TTL and a heartbeat after it began writing N+1 (moveSpan,
//     started again by a refresh that fails in it), so the heartbeat
//     reads no state after that; claims always move. A release that drops reading N may
//     follow once the region has been in N+1 for a session TTL and a
//     grace. A store that finds the marker naming a format it cannot read,
//     at Preload or at run time, writes nothing (a SchemaError); at run
//     time its Ping fails with it too, so its node's /healthz answers 503
//     saying why.
//
// An operator therefore rolls the nodes (drain, start, healthy: nothing
// else), then runs presenced upgrade (it shows the region's format and
// each holder's) and presenced upgrade --finish. To roll back before the
// switch, roll the nodes back to the old release the same way: the data
// is in its format. After the switch there is no rollback: the old
// release refuses the region. A release that changes the format says so
// first in the CHANGELOG, with the format it reads and writes and the
// release it runs beside. A build with the presenceformat3 tag is the
// test format 3 (format_three.go), which proves this in the tests.
//
// Reading it with redis-cli (quote the braces for the shell):
//
//	# live members of room42: entries whose until (s) is from now on
//	redis-cli zcount 'presence:{room42}' "$(date +%s.%3N)" +inf
//	# one user's sessions in room42 with their expiry (unix seconds)
//	redis-cli zscan 'presence:{room42}:s' 0 match 'u_8827:*' count 100000
//	# (members are user:session then the holder code, e.g. "\xa3")
//	# which store holds which code
//	redis-cli hgetall presence:holders
//
// # Time
//
// Scripts score entries with Redis's own clock (TIME), never a node's (and
// the one read that is not a script, a small room's snapshot in a MULTI,
// cuts by the TIME read in it; snaptx.go): a
// node whose clock is ahead or behind still writes the same expiry, so skew
// between nodes cannot expire a live session or keep a dead one. Within a
// room there is one clock, the one of the Redis primary holding its slot.
// Session expiry and a member's until are rounded up to a whole second
// (they are stored in seconds to keep listpack entries small); a session
// or a member is never dropped early, and at most one second late.
//
// # Holders
//
// A session is held by one node at a time, whose holder code ends its
// entry (holders.go: codes are leased, one byte long, and reused only a
// quarantine after their holder's lease ended). A join
// (Claim) takes the session over from any other holder: the client has
// reconnected to this node. The heartbeat (Refresh) never takes a session
// back; it reports it Lost, and the node closes its stale connection.
// Release and SetState act only on the caller's own entry. So a release or
// a state write of the old node that reaches Redis after the new node's
// join changes nothing, whatever order the scripts arrive in. A tombstone
// keeps a holder's late refresh from bringing back a session that was
// taken from it or that it released itself (a refresh already under way
// when it decided to release); its next claim lifts it. A refresh that
// finds its session taken reports it Lost while another holder has it, and
// Orphaned once that holder has released it too: a node whose connection
// for it is live (the taker's connection was already gone) claims it back.
//
// # Waiting clients
//
// During a reconnect storm a node admits joins at a bounded rate and
// refuses the rest with a retry hint. Extend (extend.lua) keeps the
// sessions of the refused clients as they were while they wait: their
// existing entries in s, whoever holds them (a released entry in its
// grace too), and their users' until in z are pushed back to a session
// TTL from now. It writes no new key and no entry, claims nothing and
// announces nothing; a session with no live entry (live as reads see it,
// read slack included: its end is not announced yet) is left alone. A client
// that gives up is no longer extended, and its session ends a TTL later
// as it would have.
//
// # Transitions
//
// A user's first live session in a room announces online (joined), naming
// the session. A further session of a member announces update (joined);
// refreshes announce nothing. A clean close (Release) leaves the session
// listed, state included, for the offline grace; a session that returns
// inside it, on any node, takes its entry back silently. If it does not
// return, its end is announced: update (left) while the user has another
// session, else the user's offline (left). A session whose holder stops
// refreshing it while its user stays a member ends with update (expired).
// A clean close of the last session keeps the user a member for the grace.
// A session whose holder has written nothing in its slot for
// presence.Timing.Unrefreshed (a heartbeat and a half: its node died or
// stalls) is stale, and does not hold its user against a clean close. A
// late refresh of a session does not make it stale while its node writes
// others in the slot (on one Redis, every heartbeat tick). So
// every clean close makes the user's departure pending (g), due when the
// grace ends and every session of theirs that a node holds is stale: at
// the grace's end, or when the freshest of those goes stale if that is
// later. Any touch of a session of the user (its holder's heartbeat, a
// join) cancels it; the user then stays, and their sessions end one by
// one. A dead node's session never refreshes: its user leaves in one
// offline (left), with that session, before it expires, never through a
// member with no session. A holder's last write in the slot is kept to
// the ms (presence:reap:w); an entry extended since for a waiting client
// (Extend), or one with no record, is judged by its expiry instead. A
// departure that comes due while a holder of the user's sessions still
// writes waits until it has been silent that long. While the
// region holds expiries after an outage, such a departure that came due
// after the outage began waits with them: the holder gets its heartbeat's
// chance to refresh. When sessions simply stop being refreshed, their
// node having died, the reaper announces offline (expired) once the
// user's until passes. Reads exclude expired entries by score, so they
// are right before any reaper runs.
//
// Each script appends its transitions to the room's outbox in the same
// atomic step and returns them; the Store hands them to the Sink and then
// removes exactly those entries. If the process dies in between, the reap
// index brings the room back to some reaper after the publish lease, and it
// delivers them again with the same ids. A departure therefore never lives
// only in a process's memory. A FlooredSink (the bus publisher) names the
// creation time of its stream: a room numbered before it, the stream having
// been made again after its store was lost, starts a new epoch and its
// waiting entries are numbered again from 1 (renumber.lua) before they are
// handed over, so no room continues its old numbering in a new stream.
//
// # Reaping
//
// The reap index holds, per room, the first moment something in it may be
// overdue, never later. A sweep reads the entries that are due (one call;
// on a cluster one per master), settles those rooms and re-indexes them, so
// its cost follows the due rooms, not all rooms; a live room comes due
// about once per TTL to move its entry forward. Any number of reapers may
// run: a room script first checks that the room is still due, and settling
// is atomic, so each change is announced once. On a cluster, reading a
// master's slot indexes costs O(slots it serves); the periodic reapers of
// all nodes share that read through a claim marker on the master, so it
// happens about once per reap interval however many nodes run.
package region
