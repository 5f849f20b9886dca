package bus

import (
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/presence"
)

// FeedFlapping subscribes f to the transitions of region (or of
// GlobalRegion, the global view's) on nc: every presence event of the
// view, as the webhooks and any subscriber see them. Messages whose
// subject is not a transition's of the view, or whose body is not a
// version 1 event, are skipped. Unsubscribe the returned subscription to
// stop. Every node with API keys pays it for every event of its region:
// the room, user and kind are read from the subject (EventSubject names
// them), of the body only the version and reason are decoded
// (BENCHMARKS.md has the cost); the detector's memory is bounded
// (NewFlapping's max).
func FeedFlapping(nc *nats.Conn, region string, f *Flapping) (*nats.Subscription, error) {
	if nc == nil || f == nil {
		return nil, errors.New("bus: flapping feed: a connection and a detector are required")
	}
	if region != GlobalRegion {
		if err := ValidateRegion(region); err != nil {
			return nil, err
		}
	}
	return nc.Subscribe(RegionFilter(region), func(m *nats.Msg) {
		if room, user, k := flapOf(m, region); k != 0 {
			f.observe(room, user, k)
		}
	})
}

// flapOf reads what the detector needs of a message of region; 0: none.
// The body is decoded into its version and reason only.
func flapOf(m *nats.Msg, region string) (room, user string, k flapKind) {
	r, room, kind, user, err := ParseSubject(m.Subject)
	if err != nil || r != region {
		return "", "", 0
	}
	var e struct {
		V      int             `json:"v"`
		Reason presence.Reason `json:"reason"`
	}
	if json.Unmarshal(m.Data, &e) != nil || e.V != EventVersion {
		return "", "", 0
	}
	return room, user, kindOf(presence.Transition{Kind: kind, Reason: e.Reason})
}
