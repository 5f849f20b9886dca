// Package oracle is the presence service's test oracle: a seeded schedule of
// client operations, and a checker that knows what a correct service
// announces for whatever really happened. It does no I/O: the harness
// (cmd/presenced/oracle_test.go) drives real nodes, records every operation
// with the time it really happened and every transition the service
// emitted, and hands the record (a Run) to Check. docs/ORACLE.md describes
// the harness and how to run it.
//
// # The promise
//
// Presence is per (room, user): the user is online while any of their
// sessions in the room is live. A session (a session id) is certainly held
// from the acknowledgement of a join (the snapshot reply) until its
// connection ends, its leave is sent, or its node dies. A Span is one such
// hold; the union of a key's overlapping spans is a Period, during which
// the user is certainly online: no offline may be announced then (class 2).
//
// When a period ends, a departure is in progress (a Gap), and its Window
// says when and why the offline comes:
//
//   - released at c (clean close, leave or TCP reset; the node sees a
//     reset at once on loopback): offline left, in [c+grace-margin,
//     c+grace+reap+margin];
//   - abandoned at k (the node was SIGKILLed or crashed; or it closed the
//     connection keeping the session, as 4001 does, and nothing took it
//     up): the session was last refreshed at most a heartbeat before k and
//     expires a TTL later, rounded up to a whole second, so offline expired
//     in [k+TTL-heartbeat-margin, k+TTL+1s+reap+margin];
//   - released at c while another session of the user in the room was
//     abandoned at k <= c: that session no longer holds the user once stale,
//     1.5 heartbeats after its node's last write (k, for a kill; up to its
//     expiry when its node lived on, as after a 4001), so the departure is
//     left, in one offline, in [c+grace-margin, max(c+grace,
//     k+1.5*heartbeat)+reap+margin], never through a member with no
//     session;
//   - abandoned at k by a kill a heartbeat (and a margin) or less after
//     another session was released with no join since: the dead node may
//     not have refreshed its session after the close, so the departure is
//     ambiguous: left or expired, up to the expiry window's end.
//
// Times: a window's lower bound is judged on the event's own time (the
// store's clock, on the harness's host), its upper bound on when the event
// was announced (the earlier of its stream timestamp and its arrival at
// the core subscriber). An offline settled in time by a node killed within
// a margin of it is published by a reaper only after the publish lease, by
// design: that lateness is judged leniently.
//
// A return (a session of the user held again, the same session id or
// another, on any node) acknowledged before the window opens cancels the
// departure: nothing at all is announced (class 3). One sent after the
// window closed comes after the offline: offline, then online. A return in
// between may do either, and is counted as ambiguous. Every certain
// departure is announced exactly once, within its window, with the right
// reason (class 4), and every arrival (the first period, a return after an
// offline) once.
//
// The stream itself: per key, in (epoch, seq) order, onlines and offlines
// alternate starting with an online (class 1; a second online in a row is
// counted apart as "repeated online"), and no update or client snapshot
// leaves a member with no session (class 1z); no id twice in the stream (class 5;
// a second delivery of an id to a core subscriber is counted apart, as the
// bus allows it); per room and epoch, seq runs 1, 2, 3... (class 6); the
// stream holds exactly the ids the core subscriber saw (class 7). After
// quiescing, the query service and a fresh snapshot show exactly the held
// sessions and their last states (class 8), and every open client's view
// (its join snapshot, then the room's events in arrival order, replaced by
// each resync snapshot) equals the fresh snapshot (class 9). Resync
// snapshots are counted; one for which nothing was missing is flagged
// spurious (informational).
//
// Ambiguity is never skipped silently: a case the oracle cannot decide is
// judged leniently and counted in Report.Ambiguous. The schedule (Generate)
// keeps every planned return and clean close out of the ambiguous bands by
// the margin, so ambiguous cases come only from timing drift.
package oracle
