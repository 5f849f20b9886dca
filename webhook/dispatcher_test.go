package webhook

import (
	"fmt"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// Transitions published to a region's stream reach the endpoint signed,
// batched, in seq order per room, each once.
func TestDeliversInOrderOnce(t *testing.T) {
	e := newEnv(t, "eu")
	r := newReceiver(t)
	e.dispatcher(config(t, endpoint("a", r.srv.URL)))
	waitLanes(t, e, "a", "eu")
	want := e.churn("eu", 5, 200)
	waitEvents(t, r, len(want), 20*time.Second)
	checkContract(t, r, want, false)
	if n := len(r.deliveries()); n >= len(want) {
		t.Errorf("%d deliveries for %d events: not batched", n, len(want))
	}
}

// waitLanes waits until the lane's consumer exists: what is published
// after is the lane's.
func waitLanes(t *testing.T, e *env, endpoint, source string) {
	t.Helper()
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		s, err := e.js.Stream(t.Context(), "PRESENCE_"+source)
		if err != nil {
			return fmt.Errorf("stream of %s: %w", source, err)
		}
		if _, err = s.Consumer(t.Context(), ConsumerName(endpoint)); err != nil {
			return fmt.Errorf("lane consumer %s/%s: %w", endpoint, source, err)
		}
		return nil
	})
}

var _ = presence.Online
