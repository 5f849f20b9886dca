package node

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
	"github.com/presence-dev/presence/region"
)

func TestAppointmentsHoldAJoinToItsHint(t *testing.T) {
	a := NewAppointments(10, time.Minute)
	r := presence.SessionRef{Room: "r", User: "u", Session: "s"}
	t0 := time.Unix(1000, 0)
	if _, early := a.Early(r, t0); early {
		t.Fatal("early without an appointment")
	}
	a.Set(r, t0, 4*time.Second) // due at 3 s: a client may jitter -25 %
	if left, early := a.Early(r, t0.Add(time.Second)); !early || left != 2*time.Second {
		t.Fatalf("1 s after a 4 s hint: early %v, left %v; want early, 2s left", early, left)
	}
	a.Set(r, t0.Add(time.Second), 10*time.Second) // refused again while not due: the first place stands
	if left, early := a.Early(r, t0.Add(2999*time.Millisecond)); !early || left != time.Millisecond {
		t.Fatalf("just before the appointment: early %v, left %v", early, left)
	}
	if _, early := a.Early(r, t0.Add(3*time.Second)); early {
		t.Fatal("at the appointment: early")
	}
	if a.Len() != 0 {
		t.Fatal("an appointment used up is kept")
	}
	for i := range 20 {
		a.Set(presence.SessionRef{Room: "r", User: fmt.Sprint(i), Session: "s"}, t0, time.Second)
	}
	if a.Len() != 10 {
		t.Fatalf("%d appointments kept, at most 10", a.Len())
	}
	a.Set(r, t0.Add(2*time.Minute), time.Second) // sweeps those due over a minute ago
	if a.Len() != 1 {
		t.Fatalf("%d appointments after the sweep, want 1", a.Len())
	}
}

// stormSim is a reconnect storm on one node's join limiter, with a
// scripted clock: half the clients resend their join every 120 ms
// whatever the hint, half come back after it with ±25 % jitter. It
// returns each population's median and slowest time to admission.
func stormSim(n int, rate float64, fair bool, seed uint64) (greedy, honest [2]time.Duration) {
	rnd := rand.New(rand.NewPCG(seed, seed))
	lim := NewJoinLimiter(JoinLimit{Rate: rate, MinRate: rate, Latency: time.Second, MinRetry: minRetryAfter, MaxRetry: 15 * time.Second})
	lim.rnd = rnd.Float64
	appts := NewAppointments(n, time.Minute)
	t0 := time.Unix(1000, 0)
	q := &arrivals{}
	for i := range n {
		heap.Push(q, arrival{at: t0.Add(time.Duration(rnd.Float64() * float64(time.Second))), client: i})
	}
	var g, h []time.Duration
	for q.Len() > 0 {
		a := heap.Pop(q).(arrival)
		ref := presence.SessionRef{Room: "r", User: fmt.Sprint(a.client), Session: "s"}
		ok, hint := false, time.Duration(0)
		if left, early := appts.Early(ref, a.at); fair && early {
			hint = left
		} else {
			ok, hint = lim.Admit(a.at)
		}
		greedyClient := a.client%2 == 0
		if ok {
			if greedyClient {
				g = append(g, a.at.Sub(t0))
			} else {
				h = append(h, a.at.Sub(t0))
			}
			continue
		}
		if fair {
			appts.Set(ref, a.at, hint)
		}
		next := a.at.Add(time.Duration(float64(hint) * (0.75 + 0.5*rnd.Float64())))
		if greedyClient {
			next = a.at.Add(120 * time.Millisecond)
		}
		heap.Push(q, arrival{at: next, client: a.client})
	}
	slices.Sort(g)
	slices.Sort(h)
	return [2]time.Duration{g[len(g)/2], g[len(g)-1]}, [2]time.Duration{h[len(h)/2], h[len(h)-1]}
}

type arrival struct {
	at     time.Time
	client int
}

type arrivals []arrival

func (q arrivals) Len() int           { return len(q) }
func (q arrivals) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q arrivals) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *arrivals) Push(x any)        { *q = append(*q, x.(arrival)) }
func (q *arrivals) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// Without appointments, clients that resend every 120 ms get in long
// before those that honour the hint; with them, neither population is
// favoured: each gets one attempt per hint.
func TestAppointmentsMakeTheStormFair(t *testing.T) {
	for seed := range uint64(5) {
		g, h := stormSim(2000, 200, false, seed)
		if g[0]*2 > h[0] {
			t.Errorf("seed %d, no appointments: greedy median %v, honest %v: the storm was fair already?", seed, g[0], h[0])
		}
		fg, fh := stormSim(2000, 200, true, seed)
		if ratio := float64(fg[0]) / float64(fh[0]); ratio < 0.8 || ratio > 1.25 {
			t.Errorf("seed %d, appointments: greedy median %v, honest %v (ratio %.2f)", seed, fg[0], fh[0], ratio)
		}
		t.Logf("seed %d: without appointments greedy p50 %v max %v, honest p50 %v max %v; with: greedy p50 %v max %v, honest p50 %v max %v",
			seed, g[0], g[1], h[0], h[1], fg[0], fg[1], fh[0], fh[1])
	}
}

// A reconnect storm on a real node whose join limiter admits 20 joins a
// second: half the clients resend their join every 120 ms whatever
// retry_after_ms says, half honour it with ±25 % jitter. The greedy ones
// are refused until their appointment and do not get in sooner.
func TestAStormDoesNotFavourClientsThatRetryEarly(t *testing.T) {
	slow(t)
	e := newEnv(t)
	// Hints of up to 4 s need a longer TTL than the tests' (a refused
	// client's session must outlive its hint).
	st, err := region.New(e.rdb, region.Options{Region: "eu", Sink: e.sink, Logger: quiet, Timing: presence.Timing{
		SessionTTL: 12 * time.Second, Heartbeat: 4 * time.Second, OfflineGrace: 5 * time.Second,
		ReapInterval: time.Second, LastSeenInterval: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	e.runReaper(st)
	n := e.newNode(func(c *Config) {
		c.Store = st
		c.Limits.JoinRate, c.Limits.JoinRateMin = 10, 10
		// 150 clients on a loaded machine: pings the test's short pong
		// timeout would drop are not what this test is about.
		c.Limits.PingInterval, c.Limits.PongTimeout = 5*time.Second, 5*time.Second
	})
	const clients = 150
	cs := make([]*client, clients)
	for i := range cs {
		cs[i] = n.dial(t, token(t, fmt.Sprintf("u%d", i), []string{"*"}, time.Hour), "s")
	}
	type result struct {
		took  time.Duration
		tries int
		err   error
	}
	results := make(chan [2]any, clients)
	start := time.Now()
	for i, c := range cs {
		greedy := i%2 == 0
		answers := make(chan frame, 64)
		go func() { // read every frame, so pings are answered meanwhile
			for f := range c.frames {
				if f.Ref == "j" {
					answers <- f
				}
			}
			close(answers)
		}()
		go func() {
			var r result
			join := []byte(`{"type":"join","room":"storm","ref":"j"}`)
			for r.err == nil {
				r.tries++
				if r.err = c.ws.WriteMessage(1, join); r.err != nil {
					break
				}
				var f frame
				var ok bool
				select {
				case f, ok = <-answers:
				case <-time.After(30 * time.Second):
				}
				if !ok {
					r.err = fmt.Errorf("no answer to join %d (connection: %v)", r.tries, c.w.Err())
					break
				}
				if f.Type == "snapshot" {
					r.took = time.Since(start)
					break
				}
				if f.Code != protocol.CodeUnavailable {
					r.err = fmt.Errorf("join: %s %s", f.Code, f.Message)
					break
				}
				wait := time.Duration(float64(f.RetryAfterMS) * float64(time.Millisecond) * (0.75 + 0.5*rand.Float64()))
				if greedy {
					wait = 120 * time.Millisecond
				}
				time.Sleep(wait) // the client's own schedule is what the test is about
			}
			results <- [2]any{greedy, r}
		}()
	}
	var g, h []time.Duration
	greedyTries := 0
	for range clients {
		x := <-results
		r := x[1].(result)
		if r.err != nil {
			t.Fatal(r.err)
		}
		if x[0].(bool) {
			g = append(g, r.took)
			greedyTries += r.tries
		} else {
			h = append(h, r.took)
		}
	}
	slices.Sort(g)
	slices.Sort(h)
	gm, hm := g[len(g)/2], h[len(h)/2]
	t.Logf("greedy: p50 %v max %v (%d tries); honest: p50 %v max %v", gm.Round(time.Millisecond), g[len(g)-1].Round(time.Millisecond),
		greedyTries, hm.Round(time.Millisecond), h[len(h)-1].Round(time.Millisecond))
	if float64(gm) < 0.75*float64(hm) {
		t.Fatalf("clients that retry every 120 ms got in at a median %v, those that honour the hint at %v", gm, hm)
	}
}
