package centrifugo

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
)

// Lines as idle, latency, cf-idle and cf-latency print them.
const (
	prIdleLog = `node RSS before: 23.7 MiB
opened 15000 sessions in 30.712s (0 failed)
node RSS with 15000 sessions: 207.9 MiB; per session: 12.6 KiB
node idle CPU over 40s: 3.27% of one core (/metrics process_cpu_seconds_total)
CPU per 10k sessions, % of one core: node 1.18%, redis 1.15%, nats 0.13%; sum 3.46%
`
	prLatLog = `join -> online on NATS:        p50 0.70ms   p90 1.2ms    p99 8.05ms   max 20.0ms   seen 10000/10000  late(>1s) 0  missing 0
join -> online on WebSocket:   p50 0.92ms   p90 1.5ms    p99 11.9ms   max 25.1ms   seen 10000/10000  late(>1s) 0  missing 0  replaced by resync 0
join -> own snapshot reply:    p50 0.50ms   p90 0.9ms    p99 3.00ms   max 9.0ms    seen 10000/10000  late(>1s) 0  missing 0
CPU over the joins and the wait (10.025s), % of one core: node 67.9%, redis 37.9%, nats 15.6%, whole machine 168.2% (everything else 2.1%), stolen by the hypervisor 1.5%, load tool 44.7%
`
	cfIdleLog = `centrifugo RSS before: 30.0 MiB
opened 15000 sessions in 20s (0 failed; first error: <nil>)
node RSS with 15000 sessions: 740.0 MiB; per session: 48.5 KiB
CPU per 10k sessions, % of one core: node 9.30% (Centrifugo, /proc/1/stat over 40s)
`
	cfLatLog = `join -> online on WebSocket:   p50 0.56ms   p90 1.0ms    p99 3.14ms   max 7.0ms    seen 10000/10000  missing 0
CPU over the joins and the wait (10.02s), % of one core: centrifugo 76.0%, redis 10.3%, whole machine 133.0% (everything else 1.0%), stolen by the hypervisor 0.4%, load tool 45.7%
`
)

func TestParseFigures(t *testing.T) {
	pr := parseFigures(prIdleLog, prLatLog)
	want := sideFigures{p50: 920 * time.Microsecond, p99: 11900 * time.Microsecond, rssKiB: 12.6, cpuPer10k: 1.18, sessions: 15000, machine: 168.2, steal: 1.5}
	if pr != want {
		t.Errorf("presence: got %+v, want %+v (the WebSocket line, not NATS or the reply)", pr, want)
	}
	cf := parseFigures(cfIdleLog, cfLatLog)
	want = sideFigures{p50: 560 * time.Microsecond, p99: 3140 * time.Microsecond, rssKiB: 48.5, cpuPer10k: 9.3, sessions: 15000, machine: 133, steal: 0.4}
	if cf != want {
		t.Errorf("centrifugo: got %+v, want %+v", cf, want)
	}
	none := parseFigures("", "join -> online on WebSocket:   p50 never    p90 never    p99 never    max never")
	if none.rssKiB >= 0 || none.cpuPer10k >= 0 || none.p50 >= 0 || none.p99 >= 0 || none.machine >= 0 || none.steal >= 0 {
		t.Errorf("figures missing from the logs must read as missing: %+v", none)
	}
}

func TestVersusTable(t *testing.T) {
	got := versusTable([]sideFigures{parseFigures(cfIdleLog, cfLatLog)}, nil, []sideFigures{parseFigures(prIdleLog, prLatLog)}, 1000)
	want := `| | Centrifugo | presence | ratio |
|---|---|---|---|
| join → event at an observer WebSocket, 1000 joins/s, p50 | 0.56 ms | 0.92 ms | 1.64× |
| same, p99 | 3.14 ms | 11.90 ms | 3.79× |
| whole machine's CPU over the joins, % of one core | 133.00 % | 168.20 % | 1.26× |
| of it taken by the hypervisor (steal; high: a disturbed run) | 0.40 % | 1.50 % | n/a |
| RSS per idle WebSocket session, 15,000 JWT clients | 48.50 KiB | 12.60 KiB | 0.26× |
| node CPU per 10k idle sessions | 9.30 % | 1.18 % | 0.13× |
`
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(got, "reading presence") {
		t.Errorf("without a run of joiners reading presence the table has no rows for it:\n%s", got)
	}
	// A side without figures (a run that failed) shows n/a, not zero.
	got = versusTable([]sideFigures{parseFigures("", "")}, nil, []sideFigures{parseFigures(prIdleLog, prLatLog)}, 1000)
	if !strings.Contains(got, "| same, p99 | n/a | 11.90 ms | n/a |") || strings.Contains(got, "0.00") {
		t.Errorf("missing figures:\n%s", got)
	}
}

func TestGroupThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 15000: "15,000", 1234567: "1,234,567"} {
		if got := groupThousands(n); got != want {
			t.Errorf("groupThousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// cf-latency ranks a push never seen as never, as latency ranks a node's
// missing event: 1 of 4 missing makes p99 never, not the slowest seen.
func TestRankSeenCountsTheMissing(t *testing.T) {
	seen := make([]atomic.Int64, 4)
	for i, ns := range []int64{3e6, 0, 1e6, 2e6} {
		seen[i].Store(ns)
	}
	lat, missing := rankSeen(seen)
	want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond, measure.Never}
	if missing != 1 || !slices.Equal(lat, want) {
		t.Fatalf("rankSeen: %v, %d missing; want %v, 1", lat, missing, want)
	}
	if p50, p99 := measure.Percentile(lat, .5), measure.Percentile(lat, .99); p50 != 2*time.Millisecond || p99 != measure.Never {
		t.Fatalf("p50 %v, p99 %v; want 2ms, never", p50, p99)
	}
}

// With a run of joiners reading presence, its figures get rows of their
// own beside presence's same ones; the plain rows are unchanged.
func TestVersusTableWithJoinersReadingPresence(t *testing.T) {
	const cfPresLog = `join -> online on WebSocket:   p50 0.61ms   p90 1.1ms    p99 4.20ms   max 9.0ms    seen 10000/10000  missing 0
join -> own presence reply:    p50 0.70ms   p90 1.3ms    p99 5.00ms   max 9.5ms    seen 10000/10000  missing 0  refused 0
CPU over the joins and the wait (10.03s), % of one core: centrifugo 60.0%, redis 12.0%, load tool 40.0%, whole machine 113.0% (everything else 1.0%), stolen by the hypervisor 0.2%
`
	got := versusTable([]sideFigures{parseFigures(cfIdleLog, cfLatLog)}, []sideFigures{parseFigures("", cfPresLog)}, []sideFigures{parseFigures(prIdleLog, prLatLog)}, 1000)
	for _, want := range []string{
		"| of it taken by the hypervisor (steal; high: a disturbed run) | 0.40 % | 1.50 % | n/a |\n" +
			"| the same with Centrifugo's joiners also reading presence (a join's snapshot), p50 | 0.61 ms | 0.92 ms | 1.51× |\n" +
			"| same, p99 | 4.20 ms | 11.90 ms | 2.83× |\n" +
			"| whole machine's CPU over those joins, % of one core | 113.00 % | 168.20 % | 1.49× |\n" +
			"| RSS per idle",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

// A joiner's subscribe and presence request go in one frame, one command
// a line, the presence request second, for the joiner's own channel.
func TestJoinerPresenceRequest(t *testing.T) {
	got := string(cfPresenceCmd(cfPresenceID, "lat1-0"))
	if got != `{"id":3,"presence":{"channel":"lat1-0"}}` {
		t.Fatalf("presence command %s", got)
	}
	n := 0
	cfLines(slices.Concat(cfSubscribeCmd(2, "lat1-0", true), []byte("\n"), cfPresenceCmd(cfPresenceID, "lat1-0")), func([]byte) { n++ })
	if n != 2 {
		t.Fatalf("the joined frame reads as %d lines, want 2", n)
	}
	var m cfMsg
	if err := json.Unmarshal([]byte(`{"id":3,"presence":{"presence":{"c1":{"user":"j1-0","client":"c1"},"c2":{"user":"j1-9","client":"c2"}}}}`), &m); err != nil || m.Presence == nil {
		t.Fatalf("presence reply: %+v, %v", m, err)
	}
	if !cfListsUser(m.Presence.Presence, "j1-9") || cfListsUser(m.Presence.Presence, "j1-1") {
		t.Fatal("cfListsUser must find listed users only")
	}
}

// Repeated runs: each side's figures in one cell in the order run, the
// ratio of the medians, the idle figures from the first run's logs, and
// a note saying so.
func TestVersusTableOfRepeatedRuns(t *testing.T) {
	lat := func(p50, p99 string, machine string) string {
		return "join -> online on WebSocket:   p50 " + p50 + "   p90 1.0ms    p99 " + p99 + "   max 9.0ms    seen 10000/10000  missing 0\n" +
			"CPU over the joins and the wait (10.0s), % of one core: node 1%, whole machine " + machine + "% (everything else 1.0%), stolen by the hypervisor 0.1%\n"
	}
	cf := []sideFigures{parseFigures(cfIdleLog, lat("0.40ms", "3.00ms", "80.0")), parseFigures("", lat("0.60ms", "5.00ms", "90.0")), parseFigures("", lat("0.50ms", "4.00ms", "85.0"))}
	pr := []sideFigures{parseFigures(prIdleLog, lat("0.70ms", "6.00ms", "130.0")), parseFigures("", lat("0.80ms", "9.00ms", "140.0")), parseFigures("", lat("0.75ms", "8.00ms", "120.0"))}
	got := versusTable(cf, nil, pr, 1000)
	for _, want := range []string{
		"| join → event at an observer WebSocket, 1000 joins/s, p50 | 0.40 / 0.60 / 0.50 ms | 0.70 / 0.80 / 0.75 ms | 1.50× |\n",
		"| same, p99 | 3.00 / 5.00 / 4.00 ms | 6.00 / 9.00 / 8.00 ms | 2.00× |\n",
		"| whole machine's CPU over the joins, % of one core | 80.00 / 90.00 / 85.00 % | 130.00 / 140.00 / 120.00 % | 1.53× |\n",
		"| RSS per idle WebSocket session, 15,000 JWT clients | 48.50 KiB | 12.60 KiB | 0.26× |\n",
		"(latency: 3 interleaved runs a side, in the order run; ratios of the medians, none where a run lacks the figure)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	// A presence run with a push never seen: its cell says so and the
	// row has no ratio, rather than the ratio of the two runs that went
	// well.
	pr[1] = parseFigures("", "join -> online on WebSocket:   p50 0.80ms   p90 1.0ms    p99 never    max never    seen 9999/10000  missing 1\n")
	got = versusTable(cf, nil, pr, 1000)
	if want := "| same, p99 | 3.00 / 5.00 / 4.00 ms | 6.00 / n/a / 8.00 ms | n/a |\n"; !strings.Contains(got, want) {
		t.Errorf("table lacks %q:\n%s", want, got)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{-1, 5}, -1}, {[]float64{-1}, -1}, {nil, -1}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// versus reads the latency logs of each side as comma-separated lists,
// and refuses to run without the four it needs.
func TestVersusReadsListsOfLogs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfIdle, prIdle := write("cf-idle.log", cfIdleLog), write("pr-idle.log", prIdleLog)
	cf := write("cf1.log", cfLatLog) + "," + write("cf2.log", cfLatLog)
	pr := write("pr1.log", prLatLog) + "," + write("pr2.log", prLatLog)
	var out strings.Builder
	if err := Versus([]string{"--cf-idle", cfIdle, "--cf-latency", cf, "--idle", prIdle, "--latency", pr}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "| same, p99 | 3.14 / 3.14 ms | 11.90 / 11.90 ms | 3.79× |") || strings.Contains(out.String(), "reading presence") {
		t.Errorf("table:\n%s", out.String())
	}
	if err := Versus([]string{"--cf-idle", cfIdle, "--idle", prIdle, "--latency", pr}, &out); err == nil {
		t.Error("versus without --cf-latency must fail")
	}
	if err := Versus([]string{"--cf-idle", cfIdle, "--cf-latency", cf + ",/nonexistent.log", "--idle", prIdle, "--latency", pr}, &out); err == nil {
		t.Error("versus with a missing log must fail")
	}
}

// A run's timings: a push or reply counts only for a joiner whose
// subscribe was sent, a presence reply only if it lists the joiner, and
// the run is pending until every push (and reply, with --cf-presence)
// is in.
func TestCfTimings(t *testing.T) {
	tm := newCfTimings(7, 2, true)
	at := time.Unix(100, 0)
	tm.onJoin("ch", tm.user(0), at) // not sent yet: not timed
	tm.sent[0].Store(at.Add(-2 * time.Millisecond).UnixNano())
	tm.sent[1].Store(at.Add(-3 * time.Millisecond).UnixNano())
	tm.onJoin("ch", tm.user(0), at)
	tm.onJoin("ch", "j8-1", at) // another run's user
	if !tm.pending() || tm.seen[0].Load() != int64(2*time.Millisecond) || tm.seen[1].Load() != 0 {
		t.Fatalf("pushes: %d %d", tm.seen[0].Load(), tm.seen[1].Load())
	}
	tm.onJoin("ch", tm.user(1), at)
	reply := func(users ...string) cfMsg {
		m := cfMsg{ID: cfPresenceID}
		m.Presence = &struct {
			Presence map[string]cfInfo `json:"presence"`
		}{Presence: map[string]cfInfo{}}
		for i, u := range users {
			m.Presence.Presence[fmt.Sprint(i)] = cfInfo{User: u}
		}
		return m
	}
	tm.onReply(0)(reply("someone else"), at)
	tm.onReply(1)(reply(tm.user(1)), at)
	if !tm.pending() || tm.refused.Load() != 1 || tm.answered[1].Load() != int64(3*time.Millisecond) {
		t.Fatalf("replies: refused %d, answered %d", tm.refused.Load(), tm.answered[1].Load())
	}
	tm.onReply(0)(reply(tm.user(0), "someone else"), at)
	if tm.pending() {
		t.Fatal("every push and reply is in: not pending")
	}
	var b strings.Builder
	missing, replyMissing := tm.report(&b)
	if missing != 0 || replyMissing != 0 || !strings.Contains(b.String(), "own presence reply:") || !strings.Contains(b.String(), "refused 1") {
		t.Fatalf("report %d %d:\n%s", missing, replyMissing, b.String())
	}
	if newCfTimings(7, 1, false).onReply(0) != nil {
		t.Fatal("without --cf-presence no reply hook")
	}
}
