package node

import (
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// admission bounds the client requests that wait on the store at once
// (Limits.MaxInflight): a request takes a slot or is refused.
type admission struct {
	slots      chan struct{} // a token per request waiting on the store
	wait       time.Duration // Limits.AdmitWait
	overloaded prometheus.Counter
}

func newAdmission(max int, wait time.Duration) *admission {
	return &admission{slots: make(chan struct{}, max), wait: wait}
}

// admit takes a slot for a client request that waits on the store,
// waiting at most the admission wait; false means the node is past its
// capacity. The caller gives the slot back with release.
func (a *admission) admit() bool {
	select {
	case a.slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(a.wait)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return true
	case <-t.C:
		a.overloaded.Inc()
		return false
	}
}

func (a *admission) release() { <-a.slots }

// inflight reports the requests holding a slot.
func (a *admission) inflight() int { return len(a.slots) }

// retryAfter is the advice sent with an overload refusal: a jittered
// wait around the admission wait, so refused clients do not come back
// together.
func (a *admission) retryAfter() time.Duration {
	return a.wait/2 + time.Duration(rand.Int64N(int64(a.wait)))
}
