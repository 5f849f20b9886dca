// Package bus carries presence over NATS: the subject tree, the versioned
// event encoding, the JetStream stream that keeps transitions and the
// query service. It is a NATS client only: the embedded nats-server
// presenced runs without a NATS URL is internal/embedded.
//
// # Subjects
//
// subject.go builds every subject of the project (transitions, ingest,
// queries, the global view's sync and the nodes' control subjects) and
// lists the whole namespace. Transitions:
//
//	presence.<region>.<room>.<kind>.<user>   a region's transitions
//	presence.global.<room>.<kind>.<user>     the cross-region view's transitions
//
// kind is online, offline or update. Ids never contain '.', '*', '>' or
// whitespace (package presence validates them), so each id is exactly one
// token and wildcards narrow cleanly:
//
//	presence.>                     everything
//	presence.*.room42.>            room42 in every region, and globally
//	presence.eu.*.offline.*        every departure in region eu
//	presence.global.>              only the global view
//
// "global" is therefore not a valid region name. Requests to the query
// service use presence-api.<region>.<endpoint>, outside presence.>, so a
// subscriber to presence.> sees transitions only:
//
//	presence-api.<region>.members    one page of a room's members (a snapshot)
//	presence-api.<region>.count      a room's number of members
//	presence-api.<region>.user       one user's presence in a room
//	presence-api.<region>.last_seen  when a user was last active, in any room
//	presence-api.<region>.rooms      a page of the rooms with members, with counts
//	presence-api.<region>.counts     the counts of up to 100 rooms
//
// Disconnecting a user is not a query: it is served on a control
// subject, presence-ctl.<region>.disconnect, which readers cannot reach
// (control.go).
//
// # Pieces
//
// EnsureStream creates the stream PRESENCE_<region> on presence.<region>.>;
// Publisher stores a region's transitions in it, deduplicated on the
// Nats-Msg-Id header (the transition id); Query is the one implementation
// of each query's answer, which StartService serves on NATS (and package
// httpapi on HTTP); WatchRoom follows a room live over core NATS; Replay follows it
// from a snapshot through the stream, each transition once and in order.
// docs/BUS.md describes the wire formats and the snapshot + replay
// contract.
package bus
