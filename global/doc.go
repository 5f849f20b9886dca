// Package global builds the cross-region view of presence: a user is
// globally online in a room while any region holds a live session of
// theirs, counted once however many regions and tabs they are in.
//
// Each region runs a RegionPublisher (one active per region, by a lease
// in the region's own KV bucket). Once per cadence it publishes what
// changed since its last publication: from a ChangeSource (a
// *region.Store) it reads only the members the region's change log names,
// plus a slice of rooms it compares with what it published (the
// anti-entropy check), so its cost follows the churn, not the region's
// size. When it becomes active, and when an aggregator asks, it publishes
// a full snapshot instead; now and then a delta carries the digest of the
// published view, and an aggregator whose copy differs asks for a full.
// Publications are small and infrequent, so the WAN never carries
// heartbeats.
//
// An Aggregator unions the regions' sets keyed by (user, session) and
// announces global transitions with their own grace, so a session moving
// between regions is a non-event. A region not heard for DownAfter is
// held (it keeps its users but brings nobody online); one not heard for
// DropAfter is dropped, and users only there go offline with reason
// region_lost. Session states travel with their sessions: a member's
// state change anywhere is one global update, a session that moves
// between regions with its state is none. Several aggregators may run:
// one, elected by a lease,
// writes; every write is conditional on the stream's last sequence, so
// no transition is ever announced twice.
//
// # Subjects
//
// The view travels on presence-sync.> (region publications, resync
// requests, the leader's writes into the global stream), outside
// presence.>, so a subscriber to presence.> sees transitions only; global
// transitions are presence.global.<room>.<kind>.<user> and queries
// presence-api.global.*. Package bus builds every subject (bus.Sync*,
// bus.GlobalIngestSubject; the table is in bus/subject.go).
// docs/GLOBAL.md describes the design, the wire formats, failure
// behaviour and duplicate detection.
package global
