package webhook

import (
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// A receiver down under churn, then back: every transition is
// delivered, per room in seq order, each id accepted once, a delivery
// sent again only while it had not been accepted, and the count equals
// the stream's. CI runs a 6 s outage, not 2 minutes: the shape is the
// same (the batch in flight retried at the capped backoff, everything
// else queued behind it up to max_pending, the rest waiting in the
// consumer), only shorter; PRESENCE_WEBHOOK_LONG=1 runs the 2 minutes.
func TestReceiverDownUnderChurnThenBack(t *testing.T) {
	outage := 6 * time.Second
	if os.Getenv("PRESENCE_WEBHOOK_LONG") != "" {
		outage = 2 * time.Minute
	}
	e := newEnv(t, "eu")
	r := newReceiver(t)
	ep := endpoint("a", r.srv.URL)
	ep.MaxPending = 200
	e.dispatcher(config(t, ep))
	waitLanes(t, e, "a", "eu")
	r.setAnswer(func(int) int { return http.StatusServiceUnavailable })
	var want []presence.Transition
	end := time.Now().Add(outage)
	for time.Now().Before(end) {
		want = append(want, e.churn("eu", 8, 16)...)
		time.Sleep(50 * time.Millisecond)
	}
	failed := len(r.deliveries())
	r.setAnswer(nil)
	want = append(want, e.churn("eu", 8, 16)...)
	waitEvents(t, r, len(want), 60*time.Second)
	checkContract(t, r, want, false)
	if failed < 3 {
		t.Errorf("%d attempts during the outage: not retried", failed)
	}
	st, err := e.js.Stream(t.Context(), "PRESENCE_eu")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != uint64(len(want)) || len(r.events()) != len(want) {
		t.Errorf("stream holds %d, published %d, accepted %d", n, len(want), len(r.events()))
	}
}

// A receiver answering 500 forever: the batch is retried until its
// horizon, then dead-lettered once; later the endpoint is told with a
// dead_letter marker, first in line.
func TestServerErrorForeverDeadLettersOnce(t *testing.T) {
	e := newEnv(t, "eu")
	r := newReceiver(t)
	r.setAnswer(func(int) int { return http.StatusInternalServerError })
	ep := endpoint("a", r.srv.URL)
	ep.RetryHorizon = Duration(2 * time.Second)
	_, reg := e.dispatcher(config(t, ep))
	waitLanes(t, e, "a", "eu")
	e.publish(e.transition("eu", "r1", "u1", presence.Online), e.transition("eu", "r1", "u2", presence.Online))
	dlq := func() uint64 {
		s, err := e.js.Stream(t.Context(), DeadLetterStream)
		if err != nil {
			return 0
		}
		return s.CachedInfo().State.Msgs
	}
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return testkit.Want("dead letters", dlq(), 1) })
	attempts := len(r.deliveries())
	if attempts < 3 {
		t.Errorf("%d attempts before the dead letter", attempts)
	}
	// Only the marker is retried now, and it is never dead-lettered.
	time.Sleep(3 * time.Second)
	if n := dlq(); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
	if got := counter(t, reg, "presence_webhook_dead_letters_total"); got != 1 {
		t.Errorf("dead_letters_total %v", got)
	}
	ds, err := e.js.Stream(t.Context(), DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ds.GetLastMsgForSubject(t.Context(), "presence-webhooks.dlq.a.eu")
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(HeaderDLLast) != "500" || len(m.Data) == 0 {
		t.Errorf("dead letter headers %v", m.Header)
	}
	r.setAnswer(nil)
	e.publish(e.transition("eu", "r1", "u3", presence.Online))
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.AtLeast("accepted after the dead letter (the marker and the next event)", len(r.accepted()), 2)
	})
	got := r.accepted()
	if got[0]["kind"] != KindResync || got[0]["reason"] != ResyncDeadLetter || got[1]["user"] != "u3" {
		t.Errorf("after the dead letter: %v", got)
	}
}

// 410 Gone stops the endpoint (nothing acknowledged, nothing lost) until
// the configuration is reloaded; another 4xx is retried like a 5xx.
func TestGoneStopsUntilReloadAndOther4xxRetry(t *testing.T) {
	e := newEnv(t, "eu")
	gone, bad := newReceiver(t), newReceiver(t)
	gone.setAnswer(func(int) int { return http.StatusGone })
	bad.setAnswer(func(n int) int {
		if n < 3 {
			return http.StatusBadRequest
		}
		return http.StatusOK
	})
	cfg := config(t, endpoint("gone", gone.srv.URL), endpoint("bad", bad.srv.URL))
	d, reg := e.dispatcher(cfg)
	waitLanes(t, e, "gone", "eu")
	waitLanes(t, e, "bad", "eu")
	want := e.churn("eu", 3, 6)
	waitEvents(t, bad, len(want), 10*time.Second)
	checkContract(t, bad, want, false)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("presence_webhook_disabled{gone}", gauge(reg, "presence_webhook_disabled", "gone"), 1)
	})
	n := len(gone.deliveries())
	time.Sleep(time.Second)
	if len(gone.deliveries()) != n || n != 1 {
		t.Fatalf("%d attempts after 410, then %d: want 1, then none", n, len(gone.deliveries()))
	}
	gone.setAnswer(nil)
	if err := d.Reload(config(t, endpoint("gone", gone.srv.URL), endpoint("bad", bad.srv.URL))); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, gone, len(want), 10*time.Second)
	checkContract(t, gone, want, false)
}

// A receiver that answers in 10 s: the lane holds at most max_pending
// events, its lag rises, and another endpoint is not delayed.
func TestSlowReceiverIsBoundedAndAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("waits on a 10 s receiver; skipped with -short")
	}
	e := newEnv(t, "eu")
	fast := newReceiver(t)
	var mu sync.Mutex
	slowHits := 0
	slow := newReceiver(t)
	slow.setAnswer(func(int) int {
		mu.Lock()
		slowHits++
		mu.Unlock()
		time.Sleep(10 * time.Second)
		return http.StatusOK
	})
	se := endpoint("slow", slow.srv.URL)
	se.Timeout, se.MaxPending = Duration(15*time.Second), 50
	_, reg := e.dispatcher(config(t, se, endpoint("fast", fast.srv.URL)), func(o *Options) { o.LeaseTTL = 40 * time.Second })
	waitLanes(t, e, "slow", "eu")
	waitLanes(t, e, "fast", "eu")
	start := time.Now()
	want := e.churn("eu", 10, 400)
	waitEvents(t, fast, len(want), 15*time.Second)
	if took := time.Since(start); took > 9*time.Second {
		t.Errorf("the fast endpoint took %v: the slow one delayed it", took)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.AtLeast("presence_webhook_lag_events{slow}", gauge(reg, "presence_webhook_lag_events", "slow"), 300)
	})
	cons, err := e.js.Consumer(t.Context(), "PRESENCE_eu", ConsumerName("slow"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending > se.MaxPending {
		t.Errorf("the slow lane holds %d unacknowledged, max_pending %d", info.NumAckPending, se.MaxPending)
	}
	mu.Lock()
	hits := slowHits
	mu.Unlock()
	if hits > 2 {
		t.Errorf("%d requests to the slow endpoint at once or in 10 s", hits)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return gauge(reg, name, "")
}

// gauge sums the samples of name whose endpoint label is endpoint (any,
// with "").
func gauge(reg *prometheus.Registry, name, endpoint string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ok := endpoint == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" && l.GetValue() == endpoint {
					ok = true
				}
			}
			if !ok {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
