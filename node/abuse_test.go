package node

import (
	"errors"
	"fmt"
	"github.com/presence-dev/presence/protocol"
	"math"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// overRate drives the rate limit and the abuse rule with a scripted clock:
// a client sends one frame every 1/(k × rate) for up to d. It returns
// when the connection would be closed (ok false: never), the frames let
// through, and the longest run of refusals in a row.
func overRate(k float64, d time.Duration) (closedAt time.Duration, ok bool, let, run int) {
	var now int64
	lim := Limits{}.WithDefaults()
	c := &conn{d: &connDeps{lim: lim, mono: func() int64 { return now }}, tokens: float64(lim.FrameBurst)}
	every := time.Duration(float64(time.Second) / (k * lim.FrameRate))
	cur := 0
	for t := time.Duration(0); t < d; t += every {
		now = int64(t)
		if c.allow() {
			let++
			cur = 0
			continue
		}
		cur++
		run = max(run, cur)
		if c.strikes.refuse(now, lim.RateStrikes, lim.RateWindow) {
			return t, true, let, run
		}
	}
	return 0, false, let, run
}

// The abuse rule at the default limits (10/s, burst 20, 10 refusals
// within 10 s), as PROTOCOL.md's "Limits" states it: a client at or
// under the rate is never closed; over it, it is closed once the burst is
// spent and ten of its frames were refused, at about (burst + strikes) /
// ((k - 1) × rate): 28 s at 1.1×, 2.85 s at 2×, 320 ms at 10× and 29 ms
// at 100×, whatever share of its frames still gets through (one in nine
// at 10×: no ten refusals in a row).
func TestAbuseRuleOverTheRate(t *testing.T) {
	lim := Limits{}.WithDefaults()
	for _, k := range []float64{0.5, 0.9, 1} {
		if at, closed, _, _ := overRate(k, 10*time.Minute); closed {
			t.Errorf("%g× the rate: closed at %v", k, at)
		}
	}
	for _, c := range []struct {
		k    float64
		want time.Duration
	}{{1.1, 28 * time.Second}, {2, 2850 * time.Millisecond}, {10, 320 * time.Millisecond}, {100, 29 * time.Millisecond}} {
		at, closed, let, run := overRate(c.k, 10*time.Minute)
		if !closed {
			t.Errorf("%g× the rate: never closed", c.k)
			continue
		}
		formula := time.Duration(float64(lim.FrameBurst+lim.RateStrikes) / ((c.k - 1) * lim.FrameRate) * float64(time.Second))
		every := time.Duration(float64(time.Second) / (c.k * lim.FrameRate))
		if d := at - formula; math.Abs(float64(d)) > float64(formula)/10 {
			t.Errorf("%g× the rate: closed at %v, by the rule at about %v", c.k, at, formula)
		}
		if d := at - c.want; math.Abs(float64(d)) > float64(every) {
			t.Errorf("%g× the rate: closed at %v, PROTOCOL.md says about %v", c.k, at, c.want)
		}
		t.Logf("%g× the rate: closed at %v after %d frames let through; longest run of refusals %d", c.k, at, let, run)
		if c.k == 10 && run >= lim.RateStrikes {
			t.Errorf("10× the rate: a run of %d refusals; the point is that one frame in ten gets through", run)
		}
	}
}

// The ring counts refusals within the window, not in a row, and forgets
// those older than the window.
func TestRefusalsWindow(t *testing.T) {
	var r refusals
	s := int64(time.Second)
	for i := range 9 {
		if r.refuse(int64(i)*s, 10, 10*time.Second) {
			t.Fatalf("closed after %d refusals", i+1)
		}
	}
	if !r.refuse(9*s+s/2, 10, 10*time.Second) {
		t.Fatal("ten refusals within 9.5 s did not close")
	}
	var slow refusals
	for i := range 100 {
		if slow.refuse(int64(i)*(11*s/10), 10, 10*time.Second) { // every 1.1 s: 10 span 9.9 s
			if i < 9 {
				t.Fatalf("closed at refusal %d", i+1)
			}
			break
		}
		if i == 99 {
			t.Fatal("ten refusals 1.1 s apart (9.9 s) never closed")
		}
	}
	var spaced refusals
	for i := range 100 {
		if spaced.refuse(int64(i)*(12*s/10), 10, 10*time.Second) { // 10 span 10.8 s
			t.Fatalf("refusals 1.2 s apart closed at %d", i+1)
		}
	}
}

// Real node, real time, default limits: clients sending pings at 2×, 10×
// and 100× the rate are each closed with 1008, the reason in the close
// frame, no earlier than the rule allows; one at half the rate is not.
func TestAbusersAreClosedWithTheReason(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n := e.newNode()
	lim := n.cfg.Limits
	type result struct {
		sent   int
		took   time.Duration
		err    error
		closed bool
	}
	run := func(user string, k float64, most time.Duration) result {
		c := n.dial(t, token(t, user, []string{"*"}, time.Hour), "s")
		ended := make(chan struct{})
		go func() { // read every frame, as a client must
			for range c.w.Frames {
			}
			close(ended)
		}()
		every := time.Duration(float64(time.Second) / (k * lim.FrameRate))
		start := time.Now()
		var r result
		ping := []byte(`{"type":"ping"}`)
	send:
		for time.Since(start) < most {
			if err := c.ws.WriteMessage(websocket.TextMessage, ping); err != nil {
				break
			}
			r.sent++
			select {
			case <-ended:
				break send
			case <-time.After(every):
			}
		}
		r.took = time.Since(start)
		select {
		case <-ended:
		default:
			if r.took >= most {
				return r // still open: not closed
			}
			select { // a write failed: the end is on its way
			case <-ended:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: writes failed but the connection did not end", user)
			}
		}
		r.closed, r.err = true, c.w.Err()
		return r
	}
	reason := policyReason(&lim)
	for _, k := range []float64{2, 10, 100} {
		t.Run(fmt.Sprintf("%gx", k), func(t *testing.T) {
			r := run(fmt.Sprintf("abuser%g", k), k, 20*time.Second)
			var ce *websocket.CloseError
			if !errors.As(r.err, &ce) || ce.Code != protocol.ClosePolicy || ce.Text != reason {
				t.Fatalf("%g× the rate: ended with %v after %d frames, want close %d %q", k, r.err, r.sent, protocol.ClosePolicy, reason)
			}
			// The node cannot close before the burst is spent and ten
			// frames were refused; a sender slowed by load only
			// closes later.
			if least := lim.FrameBurst + lim.RateStrikes; r.sent < least {
				t.Fatalf("%g× the rate: closed after %d frames, fewer than burst + strikes (%d)", k, r.sent, least)
			}
			formula := time.Duration(float64(lim.FrameBurst+lim.RateStrikes) / ((k - 1) * lim.FrameRate) * float64(time.Second))
			if r.took < formula*8/10 {
				t.Fatalf("%g× the rate: closed after %v, before the rule allows (%v)", k, r.took, formula)
			}
			t.Logf("%g× the rate: closed with 1008 after %v and %d frames (rule: %v)", k, r.took.Round(time.Millisecond), r.sent, formula.Round(time.Millisecond))
		})
	}
	t.Run("0.5x", func(t *testing.T) {
		if r := run("calm", 0.5, 3*time.Second); r.closed {
			t.Fatalf("a client at half the rate was closed: %v", r.err)
		}
	})
}
