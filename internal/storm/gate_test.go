package storm

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/presence-dev/presence/presence"
)

// The gate on synctest's clock (it reads time.Now): the limiter's burst
// is admitted; a refused join back before its appointment is refused
// again with the time left and takes no token; at its appointment it is
// admitted by the refilled bucket. Without a limiter a refusal's hint is
// the node's Wait. A claim its caller left does not cut the rate; a slow
// one does.
func TestGateHoldsARefusedJoinToItsHint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := NewJoinLimiter(JoinLimit{Rate: 2, MinRate: 1, Latency: time.Second, MinRetry: 250 * time.Millisecond, MaxRetry: 10 * time.Second})
		lim.rnd = func() float64 { return 0.5 } // no jitter
		g := &Gate{Limiter: lim, Appts: NewAppointments(10, time.Minute)}
		ref := func(u string) presence.SessionRef { return presence.SessionRef{Room: "r", User: u, Session: "s"} }
		for _, u := range []string{"a", "b"} {
			if ok, _ := g.Admit(ref(u)); !ok {
				t.Fatalf("%s refused within the burst of 2", u)
			}
		}
		ok, hint := g.Admit(ref("c"))
		if ok || hint != 500*time.Millisecond {
			t.Fatalf("the third join: admitted %v, hint %v; want refused, told 500ms (1 owed at 2/s)", ok, hint)
		}
		g.Appts.Set(ref("c"), time.Now(), hint) // as the node's refusal does: due at 3/4 of the hint
		time.Sleep(250 * time.Millisecond)
		if ok, left := g.Admit(ref("c")); ok || left != 125*time.Millisecond {
			t.Fatalf("back early: admitted %v, left %v; want refused with 125ms left", ok, left)
		}
		time.Sleep(250 * time.Millisecond) // past the appointment; the bucket holds a token again
		if ok, _ := g.Admit(ref("c")); !ok {
			t.Fatal("refused at its appointment with a token in the bucket")
		}

		g.Observe(5*time.Second, context.Canceled)
		if r := g.Rate(); r != 2 {
			t.Fatalf("rate %v after a claim its callers left, want 2", r)
		}
		g.Observe(5*time.Second, nil)
		if r := g.Rate(); r != 1.4 {
			t.Fatalf("rate %v after a slow claim, want 1.4", r)
		}

		open := &Gate{Appts: NewAppointments(10, time.Minute), Wait: func() time.Duration { return 3 * time.Second }}
		if ok, _ := open.Admit(ref("d")); !ok || open.Rate() != 0 {
			t.Fatal("a gate without a limiter refused a join, or has a rate")
		}
		if d := open.Refused(ref("d")); d != 3*time.Second {
			t.Fatalf("hint without a limiter %v, want Wait's 3s", d)
		}
	})
}
