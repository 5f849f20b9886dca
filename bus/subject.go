package bus

import (
	"errors"
	"fmt"

	"github.com/presence-dev/presence/presence"
)

// The subject namespace. Every subject the project uses is built here;
// each root is its own top-level token, so a permission or a wildcard on
// one never reaches another.
//
//	presence.<region>.<room>.<kind>.<user>        a region's stored transitions (republished by its stream)
//	presence.global.<room>.<kind>.<user>          the cross-region view's stored transitions
//	presence-in.<region>.<room>.<kind>.<user>     nodes publish transitions here; only PRESENCE_<region> listens
//	presence-api.<region>.<endpoint>              the query service of a region (or of global):
//	                                              members, count, user, last_seen, rooms, counts
//	presence-sync.<region>.delta                  a region's deltas and liveness, to the aggregators
//	presence-sync.<region>.full                   a region's full snapshots, in parts
//	presence-sync.<region>.resync                 asks that region's active publisher for a full
//	presence-sync.resync                          asks every region for one (an aggregator starting)
//	presence-sync.global.<room>.<kind>.<user>     the leading aggregator's writes into PRESENCE_global
//	presence-ctl.<region>.takeover                a node of the region took a session over
//	presence-ctl.<region>.disconnect              disconnect a user (the service's admin endpoint)
//	presence-ctl.<region>.drop                    every node: close a user's connections
//	presence-webhooks.dlq.<endpoint>.<source>     webhook batches not delivered within their horizon
//
// Only presence.> carries transitions: a subscriber to it sees nothing
// else. kind is online, offline or update; ids are single tokens (package
// presence validates them).

// Root is the first token of every transition subject.
const Root = "presence"

// GlobalRegion is the region token of the cross-region view.
const GlobalRegion = "global"

// APIRoot is the first token of query service subjects.
const APIRoot = "presence-api"

// IngestRoot is the first token of the subjects nodes publish transitions
// on: presence-in.<region>.<room>.<kind>.<user>. Only the region's stream
// listens there. It stores each transition as
// presence.<region>.<room>.<kind>.<user> and, once stored, republishes it
// there: subscribers of presence.> see each stored transition once, in
// stream order, and nothing that was not stored.
const IngestRoot = "presence-in"

// SyncRoot is the first token of the subjects regions and aggregators
// talk on to build the cross-region view (package global).
const SyncRoot = "presence-sync"

// CtlRoot is the first token of the nodes' control subjects.
const CtlRoot = "presence-ctl"

// WebhookRoot is the first token of the webhook dispatchers' subjects.
const WebhookRoot = "presence-webhooks"

// WebhookDeadLetterFilter matches every dead-lettered webhook batch.
const WebhookDeadLetterFilter = WebhookRoot + ".dlq.>"

// WebhookDeadLetterSubject is where a batch for endpoint from source (a
// region, or global) goes once its retry horizon has passed.
func WebhookDeadLetterSubject(endpoint, source string) string {
	return WebhookRoot + ".dlq." + endpoint + "." + source
}

// Last tokens of the sync subjects of a region.
const (
	syncDelta  = "delta"
	syncFull   = "full"
	syncResync = "resync"
)

// SyncDeltaSubject is where region's active publisher sends its deltas
// (and its liveness).
func SyncDeltaSubject(region string) string { return SyncRoot + "." + region + "." + syncDelta }

// SyncFullSubject is where region's active publisher sends its full
// snapshots.
func SyncFullSubject(region string) string { return SyncRoot + "." + region + "." + syncFull }

// SyncResyncSubject asks region's active publisher for a full snapshot.
func SyncResyncSubject(region string) string { return SyncRoot + "." + region + "." + syncResync }

// SyncResyncAllSubject asks every region's active publisher for a full
// snapshot.
const SyncResyncAllSubject = SyncRoot + "." + syncResync

// GlobalIngestRoot is where the leading aggregator sends global
// transitions: the global stream stores them as presence.global.> and
// republishes them there once stored.
const GlobalIngestRoot = SyncRoot + "." + GlobalRegion

// GlobalIngestSubject is the subject an aggregator publishes the global
// transition t on.
func GlobalIngestSubject(t presence.Transition) string {
	return GlobalIngestRoot + "." + t.Room + "." + string(t.Kind) + "." + t.User
}

// TakeoverSubject is where the nodes of a region say they took sessions
// over.
func TakeoverSubject(region string) string { return CtlRoot + "." + region + ".takeover" }

// ValidateRegion checks a region name for use on the bus: a valid id that
// is not the reserved global token.
func ValidateRegion(region string) error {
	if err := presence.ValidateRegion(region); err != nil {
		return err
	}
	if region == GlobalRegion {
		return &presence.IDError{Field: "region", Value: region, Rule: "is reserved for the global view"}
	}
	return nil
}

// EventSubject is the subject of one transition.
func EventSubject(t presence.Transition) string {
	return Root + "." + t.Region + "." + t.Room + "." + string(t.Kind) + "." + t.User
}

// IngestSubject is the subject a node publishes a transition on.
func IngestSubject(t presence.Transition) string {
	return IngestRoot + "." + t.Region + "." + t.Room + "." + string(t.Kind) + "." + t.User
}

// IngestFilter matches every transition a region's nodes publish.
func IngestFilter(region string) string { return IngestRoot + "." + region + ".>" }

// RoomFilter matches every transition of one room in one region (or, with
// GlobalRegion, of the room's global view).
func RoomFilter(region, room string) string {
	return Root + "." + region + "." + room + ".>"
}

// UserFilter matches the transitions of one user in one room of a region:
// what a watch list needs, and nothing of the room's other members.
func UserFilter(region, room, user string) string {
	return Root + "." + region + "." + room + ".*." + user
}

// RegionFilter matches every transition of one region.
func RegionFilter(region string) string { return Root + "." + region + ".>" }

// APISubject is the subject of a query service endpoint for a region.
func APISubject(region, endpoint string) string { return APIRoot + "." + region + "." + endpoint }

// ParseSubject splits a transition subject into its tokens, checking each.
func ParseSubject(subj string) (region, room string, kind presence.Kind, user string, err error) {
	var tok [5]string
	n, start := 0, 0
	for i := 0; i <= len(subj); i++ {
		if i == len(subj) || subj[i] == '.' {
			if n == len(tok) {
				return "", "", "", "", fmt.Errorf("bus: subject %q has more than 5 tokens", subj)
			}
			tok[n] = subj[start:i]
			n++
			start = i + 1
		}
	}
	if n != 5 || tok[0] != Root {
		return "", "", "", "", fmt.Errorf("bus: subject %q is not %s.<region>.<room>.<kind>.<user>", subj, Root)
	}
	kind = presence.Kind(tok[3])
	if !kind.Valid() {
		return "", "", "", "", fmt.Errorf("bus: subject %q: unknown kind %q", subj, tok[3])
	}
	if tok[1] != GlobalRegion {
		err = presence.ValidateRegion(tok[1])
	}
	if err = errors.Join(err, presence.ValidateRoom(tok[2]), presence.ValidateUser(tok[4])); err != nil {
		return "", "", "", "", fmt.Errorf("bus: subject %q: %w", subj, err)
	}
	return tok[1], tok[2], kind, tok[4], nil
}
