package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
)

// The memory of a `presenced webhooks` process while its endpoint is down
// (503) and transitions arrive at 1,000/s over 1,000 rooms, for
// PRESENCE_BENCH_OUTAGE (10m by default): the process's peak resident
// set, then how long it takes to deliver the backlog once the endpoint
// answers.
func BenchmarkWebhookOutageMemory(b *testing.B) {
	outage := 10 * time.Minute
	if v := os.Getenv("PRESENCE_BENCH_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		outage = d
	}
	ns := testnats.Start(b)
	e := &env{t: b, nats: ns.ClientURL(), nc: testnats.Connect(b, ns)}
	js, _ := jetstream.New(e.nc)
	if _, err := bus.EnsureStream(context.Background(), js, bus.StreamConfig{Region: "eu"}); err != nil {
		b.Fatal(err)
	}
	pub := bus.NewPublisher(js, "eu")
	sink := newHookSink(b)
	down := true
	var mu = make(chan struct{}, 1)
	mu <- struct{}{}
	sink.fail = func() bool { <-mu; defer func() { mu <- struct{}{} }(); return down }
	p := e.startHooks(e.nats, sink)
	testkit.CheckFor(b, 20*time.Second, 10*time.Millisecond, func() error {
		_, err := js.Consumer(context.Background(), "PRESENCE_eu", "webhook_e2e")
		return err
	})
	b.ResetTimer()
	seq := map[string]uint64{}
	peak, n := 0, 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(outage); time.Now().Before(end); {
		<-tick.C
		var ts []presence.Transition
		for range 10 {
			room := fmt.Sprintf("room%d", n%1000)
			seq[room]++
			n++
			ts = append(ts, presence.Transition{ID: fmt.Sprintf("eu/%s/1/%d", room, seq[room]), Region: "eu", Room: room, User: "u" + strconv.Itoa(n),
				Kind: presence.Online, Reason: presence.Joined, Sessions: 1, Seq: seq[room], Epoch: 1, At: time.Now()})
		}
		if _, err := pub.Publish(context.Background(), ts); err != nil {
			b.Fatal(err)
		}
		if n%10000 == 0 {
			peak = max(peak, rssKiB(b, p.cmd.Process.Pid))
		}
	}
	<-mu
	down = false
	mu <- struct{}{}
	back := time.Now()
	for sink.distinct() < n {
		time.Sleep(50 * time.Millisecond)
		peak = max(peak, rssKiB(b, p.cmd.Process.Pid))
	}
	b.StopTimer()
	b.ReportMetric(float64(n), "transitions")
	b.ReportMetric(float64(peak)/1024, "peak_rss_MiB")
	b.ReportMetric(time.Since(back).Seconds(), "drain_s")
	b.ReportMetric(0, "ns/op")
}

// rssKiB reads a process's resident set from /proc.
func rssKiB(b *testing.B, pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.Fields(v)[0])
			return kb
		}
	}
	return 0
}
