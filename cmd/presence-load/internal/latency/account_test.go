package latency

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/cmd/presence-load/internal/load"
	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
	"github.com/presence-dev/presence/protocol"
)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// Frames as the node writes them (docs/PROTOCOL.md).
func eventFrame(room, user, kind string, seq int) []byte {
	return []byte(fmt.Sprintf(`{"type":"event","event":{"v":1,"id":"load/%s/1/%d","kind":%q,"reason":"joined","region":"load","room":%q,"user":%q,"sessions":1,"seq":%d,"epoch":1,"at":"2026-01-01T00:00:00Z"}}`,
		room, seq, kind, room, user, seq))
}

func snapshotFrame(room, reason, ref string, users ...string) []byte {
	var ms []string
	for _, u := range users {
		ms = append(ms, fmt.Sprintf(`{"user":%q,"until":"2026-01-01T00:00:45Z","sessions":[{"id":"s","expires":"2026-01-01T00:00:45Z"}]}`, u))
	}
	refField := ""
	if ref != "" {
		refField = fmt.Sprintf(`"ref":%q,`, ref)
	}
	return []byte(fmt.Sprintf(`{"type":"snapshot",%s"room":%q,"reason":%q,"truncated":false,"snapshot":{"region":"load","room":%q,"at":"2026-01-01T00:00:00Z","total":%d,"offset":0,"members":[%s],"room_seq":9,"epoch":1,"stream_seq":0}}`,
		refField, room, reason, room, len(users), strings.Join(ms, ",")))
}

func errorFrame(code, ref string, retryMS int) []byte {
	retry := ""
	if retryMS > 0 {
		retry = fmt.Sprintf(`,"retry_after_ms":%d`, retryMS)
	}
	return []byte(fmt.Sprintf(`{"type":"error","code":%q,"message":"x","ref":%q%s}`, code, ref, retry))
}

// TestLedgerAccounting plays a run of nine joins through the ledger and
// checks that every one lands in exactly one bucket per path.
func TestLedgerAccounting(t *testing.T) {
	l := newLedger()
	t0 := time.Unix(1_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for i := range 8 {
		room := "rA"
		if i >= 6 {
			room = "rB"
		}
		l.add(fmt.Sprintf("u%d", i), room)
	}
	l.add("u8", "rA") // never sent
	for i := range 8 {
		if n := l.send(fmt.Sprintf("u%d", i), at(0)); n != 1 {
			t.Fatalf("first send of u%d is attempt %d", i, n)
		}
	}
	if l.settled() {
		t.Fatal("settled before anything arrived")
	}
	reply := func(user string, d time.Duration) {
		if r := l.joinerFrame(user, snapshotFrame(l.byUser[user].room, "join", "j1", user), at(d)); r != 0 {
			t.Fatalf("reply to %s asked for a retry", user)
		}
	}
	// The joiner's own connection also carries the room's events: skipped.
	if r := l.joinerFrame("u0", eventFrame("rA", "u1", "online", 3), at(0)); r != 0 {
		t.Fatal("event on a joiner's connection asked for a retry")
	}
	// u0: on time on both paths.
	reply("u0", ms(1))
	l.natsEvent("online", "u0", at(ms(2)))
	l.watcherFrame("rA", eventFrame("rA", "u0", "online", 2), at(ms(3)))
	// u1: late on both, still measured.
	reply("u1", ms(1))
	l.natsEvent("online", "u1", at(1500*time.Millisecond))
	l.watcherFrame("rA", eventFrame("rA", "u1", "online", 3), at(1600*time.Millisecond))
	// u2: on NATS, but the watcher gets a resync snapshot listing it
	// instead of its event. The same snapshot lists u0, already seen.
	reply("u2", ms(1))
	l.natsEvent("online", "u2", at(ms(4)))
	l.watcherFrame("rA", snapshotFrame("rA", "resync", "", "u0", "u1", "u2", "w0"), at(ms(500)))
	// A duplicate of an event already seen is a protocol violation.
	l.watcherFrame("rA", eventFrame("rA", "u0", "online", 2), at(ms(600)))
	// u3: answered, but its online never shows anywhere.
	reply("u3", ms(1))
	// u4: refused for good.
	if r := l.joinerFrame("u4", errorFrame(string(protocol.CodeUnavailable), "j1", 0), at(ms(1))); r != 0 {
		t.Fatal("refusal without retry_after_ms asked for a retry")
	}
	// u5: refused with retry_after_ms, retried, served; measured from the
	// first send.
	if r := l.joinerFrame("u5", errorFrame(string(protocol.CodeUnavailable), "j1", 50), at(ms(1))); r != ms(50) {
		t.Fatalf("retry delay %v, want 50ms", r)
	}
	if l.settled() {
		t.Fatal("settled with a retry pending")
	}
	if n := l.send("u5", at(ms(51))); n != 2 {
		t.Fatalf("retry is attempt %d, want 2", n)
	}
	reply("u5", ms(60))
	l.natsEvent("online", "u5", at(ms(100)))
	l.watcherFrame("rA", eventFrame("rA", "u5", "online", 10), at(ms(101)))
	// Offline events and watcher onlines are not joins.
	l.natsEvent("offline", "u9", at(ms(5)))
	l.natsEvent("online", "w0", at(ms(5)))
	// u6 and u7 in room B: the watcher's connection ends after u6's
	// event; u7 reached NATS only.
	reply("u6", ms(1))
	reply("u7", ms(1))
	l.natsEvent("online", "u6", at(ms(3)))
	l.watcherFrame("rB", eventFrame("rB", "u6", "online", 2), at(ms(3)))
	// An event of room A on room B's watcher is not an arrival.
	l.watcherFrame("rB", eventFrame("rA", "u7", "online", 7), at(ms(3)))
	l.natsEvent("online", "u7", at(ms(3)))
	l.watcherGone("rB", "close 4000")
	// NATS redelivery is counted, not measured twice.
	l.natsEvent("online", "u7", at(ms(9)))
	// u3 is still due on both paths.
	if l.settled() {
		t.Fatal("settled with u3 outstanding")
	}
	if rp, n, w := l.pending(); rp != 0 || n != 1 || w != 1 {
		t.Fatalf("pending reply %d NATS %d WebSocket %d, want 0 1 1", rp, n, w)
	}

	s := l.summarize(time.Second)
	check := func(what string, got, want int) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %d, want %d", what, got, want)
		}
	}
	check("joins", s.joins, 9)
	check("sent", s.sent, 8)
	check("replied", s.replied, 7)
	check("refused for good", s.refusedFinal, 1)
	check("refused then served", s.refusedThenServed, 1)
	check("unanswered", s.unanswered, 0)
	check("nats seen", s.nats.seen, 6)       // u0 u1 u2 u5 u6 u7
	check("nats missing", s.nats.missing, 1) // u3
	check("nats late", s.nats.late, 1)       // u1
	check("nats expected", s.nats.expected(), 7)
	check("ws seen", s.ws.seen, 4)         // u0 u1 u5 u6
	check("ws resynced", s.ws.resynced, 1) // u2
	check("ws missing", s.ws.missing, 2)   // u3, u7 (watcher lost)
	check("ws late", s.ws.late, 1)
	check("ws expected", s.ws.expected(), 7)
	check("resync snapshots", s.resyncSnapshots, 1)
	check("ws duplicates", s.wsDuplicates, 1)
	check("nats duplicates", s.natsDuplicates, 1)
	check("watchers lost", s.watchersLost, 1)
	check("bad frames", s.badFrames, 0)
	if got := s.refusalCodes[string(protocol.CodeUnavailable)]; got != 2 {
		t.Errorf("unavailable refusals = %d, want 2 (u4, u5)", got)
	}
	wantWS := []time.Duration{ms(3), ms(3), ms(101), 1600 * time.Millisecond, measure.Never, measure.Never, measure.Never}
	if !slices.Equal(s.ws.lat, wantWS) {
		t.Errorf("WebSocket latencies %v, want %v", s.ws.lat, wantWS)
	}
	if got := s.nats.q(1); got != measure.Never {
		t.Errorf("NATS max = %v, want never (u3 missing)", got)
	}
	f := strings.Join(s.failures(), "; ")
	for _, want := range []string{"1 joins never sent", "1 online events missing on NATS", "2 online events missing on the WebSocket path",
		"1 online events replaced by 1 resync snapshots", "1 joins refused by the node (unavailable 2)", "1 watcher connections lost", "1 duplicate online events"} {
		if !strings.Contains(f, want) {
			t.Errorf("failures %q lack %q", f, want)
		}
	}
}

func TestLedgerCleanRunSettlesAndPasses(t *testing.T) {
	l := newLedger()
	t0 := time.Unix(1_000_000, 0)
	for i := range 3 {
		u := fmt.Sprintf("u%d", i)
		l.add(u, "r")
		l.send(u, t0)
	}
	for i := range 3 {
		u := fmt.Sprintf("u%d", i)
		l.joinerFrame(u, snapshotFrame("r", "join", "j1", u), t0.Add(ms(1)))
		l.natsEvent("online", u, t0.Add(ms(float64(i+1))))
		if l.settled() {
			t.Fatalf("settled before %s's WebSocket event", u)
		}
		l.watcherFrame("r", eventFrame("r", u, "online", i+2), t0.Add(ms(float64(i+2))))
	}
	if !l.settled() {
		t.Fatal("not settled with everything seen")
	}
	s := l.summarize(time.Second)
	if f := s.failures(); len(f) != 0 {
		t.Fatalf("clean run fails: %v", f)
	}
	if p := s.ws.q(.99); p != ms(4) {
		t.Fatalf("WebSocket p99 %v, want 4ms", p)
	}
}

func TestRetryDroppedCountsAsRefused(t *testing.T) {
	l := newLedger()
	l.add("u", "r")
	l.send("u", time.Unix(0, 0))
	if d := l.joinerFrame("u", errorFrame(string(protocol.CodeUnavailable), "j1", 5000), time.Unix(0, 0)); d != 5*time.Second {
		t.Fatalf("retry delay %v", d)
	}
	l.retryDropped("u")
	if !l.settled() {
		t.Fatal("a dropped retry leaves the join pending")
	}
	s := l.summarize(time.Second)
	if s.refusedFinal != 1 || s.nats.expected() != 0 || s.ws.expected() != 0 {
		t.Fatalf("refused %d, expected NATS %d WS %d; want 1 0 0", s.refusedFinal, s.nats.expected(), s.ws.expected())
	}
}

func TestSweepThresholds(t *testing.T) {
	step := func(rate float64, p99 time.Duration, missing int) stepResult {
		r := stepResult{plan: stepPlan{rate: rate, joins: 100}}
		for range 99 {
			r.sum.ws.lat = append(r.sum.ws.lat, ms(1))
		}
		r.sum.ws.lat = append(r.sum.ws.lat, p99)
		// nearest rank: p99 of 100 values is the 99th; make it p99.
		r.sum.ws.lat[98] = p99
		r.sum.ws.missing = missing
		r.sum.joins, r.sum.sent = 100, 100
		return r
	}
	out := sweepTable([]stepResult{
		step(250, ms(3), 0),
		step(500, ms(20), 1), // within the target, but an event was lost
		step(1000, ms(60), 0),
		step(1500, 3*time.Second, 0),
		step(2000, ms(200), 0),
		step(2500, ms(10), 0), // a pass above a failed step is not "stayed"
	}, ms(25), ms(100))
	if !strings.Contains(out, "every rate below): 250/s (above a failed step, also within it: 2500/s)") {
		t.Errorf("best rate wrong:\n%s", out)
	}
	if !strings.Contains(out, "p99 > 100ms: 1500/s") {
		t.Errorf("collapse rate wrong:\n%s", out)
	}
}

func TestPlanCapsConnections(t *testing.T) {
	e := &latencyEnv{o: load.Options{PerRoom: 50, MaxConns: 12000, Duration: 10 * time.Second}}
	p := e.plan(0, 1000)
	if p.joins != 10000 || p.capped {
		t.Fatalf("1000/s for 10s: %d joins, capped %v", p.joins, p.capped)
	}
	p = e.plan(1, 2000)
	rooms := (p.joins + 49) / 50
	if !p.capped || p.joins+rooms > 12000 {
		t.Fatalf("2000/s: %d joins + %d watchers over the cap", p.joins, rooms)
	}
	if p.duration > 6*time.Second {
		t.Fatalf("2000/s capped run lasts %v", p.duration)
	}
}

// After a run with --quiesce, the report says how the wait ended: quiet,
// or not quiet with why; without the wait it says nothing.
func TestReportQuiet(t *testing.T) {
	for _, c := range []struct {
		res  stepResult
		want string
	}{
		{stepResult{quiet: 13240 * time.Millisecond}, "node quiet again 13.2s after the run (every offline seen, connections closed)\n"},
		{stepResult{quiet: 90 * time.Second, notQuiet: "not quiet 1m30s after the run: 9 of 10 offline events seen"}, "warning: not quiet 1m30s after the run: 9 of 10 offline events seen\n"},
		{stepResult{}, ""},
	} {
		var b strings.Builder
		reportQuiet(&b, c.res)
		if b.String() != c.want {
			t.Errorf("reportQuiet(%+v) = %q, want %q", c.res.quiet, b.String(), c.want)
		}
	}
}
