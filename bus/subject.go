package bus

import (
	"errors"
	"fmt"

	"github.com/presence-dev/presence/presence"
)

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
