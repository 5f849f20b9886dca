// Package global builds the cross-region view of presence: a user is
// globally online in a room while any region holds a live session of
// theirs, counted once however many regions and tabs they are in.
//
// Each region runs a RegionPublisher (one active per region, by a lease
// in the region's own KV bucket). Once per cadence it reads the regional
// truth through a RegionSource and publishes what changed since its last
// publication; periodically, when it becomes active and when an
// aggregator asks, it publishes a full snapshot instead. Publications are
// small and infrequent, so the WAN never carries heartbeats.
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
//	presence-sync.<region>.delta               a region's deltas and liveness
//	presence-sync.<region>.full                a region's full snapshots, in parts
//	presence-sync.<region>.resync              ask a region for a full snapshot
//	presence-sync.resync                       ask every region for one
//	presence-sync.global.<room>.<kind>.<user>  the leader's writes to the global stream
//	presence.global.<room>.<kind>.<user>       global transitions (stored, then republished)
//	presence-api.global.members|count|user     global queries
//
// Everything internal is under presence-sync, outside presence.>, so a
// subscriber to presence.> sees transitions only. docs/GLOBAL.md describes
// the design, the wire formats, failure behaviour and duplicate detection.
package global
