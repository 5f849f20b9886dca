package bus

import (
	"errors"

	"github.com/nats-io/nats.go"
)

// FeedFlapping subscribes f to the transitions of region (or of
// GlobalRegion, the global view's) on nc: every presence event of the
// view, as the webhooks and any subscriber see them. Messages that are
// not events are skipped. Unsubscribe the returned subscription to stop.
// Its cost is one subscription and a few words per event; the detector's
// memory is bounded (NewFlapping's max).
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
		if t, err := DecodeEvent(m.Data); err == nil && t.Region == region {
			f.Observe(t)
		}
	})
}
