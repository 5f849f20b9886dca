package storm

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/presence-dev/presence/presence"
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
	lim := NewJoinLimiter(JoinLimit{Rate: rate, MinRate: rate, Latency: time.Second, MinRetry: 250 * time.Millisecond, MaxRetry: 15 * time.Second})
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
