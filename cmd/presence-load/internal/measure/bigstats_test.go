package measure

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFramesPerTick(t *testing.T) {
	// 10 s at 100 ms ticks is 100 ticks.
	p := FramesPerTick([]int64{100, 50, -1, 0, 120}, 10*time.Second, 100*time.Millisecond)
	if p.conns != 4 || p.Total != 270 || p.maxFrames != 120 || p.over != 1 {
		t.Fatalf("%+v", p)
	}
	if math.Abs(p.Mean-0.675) > 1e-9 || math.Abs(p.Max-1.2) > 1e-9 {
		t.Fatalf("mean %v max %v", p.Mean, p.Max)
	}
	if !strings.Contains(p.String(), "mean 0.675, max 1.200") {
		t.Fatal(p.String())
	}
	if p := FramesPerTick([]int64{5}, time.Second, 0); p.conns != 0 {
		t.Fatalf("no tick: %+v", p)
	}
	if p := FramesPerTick([]int64{-1}, time.Second, time.Millisecond); p.conns != 0 || p.Mean != 0 {
		t.Fatalf("no connection: %+v", p)
	}
	if got := ticks(1500*time.Millisecond, 100*time.Millisecond); got != 15 {
		t.Fatalf("ticks = %v", got)
	}
}

func TestRatio(t *testing.T) {
	if Ratio(3, 2) != 1.5 || Ratio(1, 0) != 0 {
		t.Fatal("ratio")
	}
}

func TestLatencies(t *testing.T) {
	send := []int64{1000, 0, 3000, 4000}
	arrive := []int64{1500, 9000, 0, 4100, 7777} // 9000: not sent; 0: not seen; 7777: no send
	got := latencies(send, arrive)
	want := []time.Duration{100 * time.Microsecond, 500 * time.Microsecond}
	if !slices.Equal(got, want) {
		t.Fatalf("latencies %v, want %v", got, want)
	}
}

func TestLatencyLineCountsNeverSeen(t *testing.T) {
	var l []time.Duration
	for i := 1; i <= 99; i++ {
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	// One never seen of 100: p99 is still measured, max is never.
	s := LatencyLine(l, 1)
	if !strings.Contains(s, "p99 99.0ms") || !strings.Contains(s, "max never") || !strings.Contains(s, "1 never seen") {
		t.Fatal(s)
	}
	// Two never seen: p99 is never.
	if s := LatencyLine(l[:98], 2); !strings.Contains(s, "p99 never") {
		t.Fatal(s)
	}
	if s := LatencyLine(nil, 0); s != "no samples" {
		t.Fatal(s)
	}
	if len(l) != 99 {
		t.Fatal("latencyLine changed its argument")
	}
}

func TestSamplesSpread(t *testing.T) {
	if got := Samples(100, 4); !slices.Equal(got, []int{12, 37, 62, 87}) {
		t.Fatalf("samples = %v", got)
	}
	if got := Samples(3, 10); len(got) != 3 || got[2] != 2 {
		t.Fatalf("more samples than members: %v", got)
	}
}

func TestParseVmRSS(t *testing.T) {
	v, err := parseVMRSS("Name:\tpresenced\nVmPeak:\t 900 kB\nVmRSS:\t  204800 kB\nThreads: 9\n")
	if err != nil || v != 200<<20 {
		t.Fatalf("%v %v", v, err)
	}
	if _, err := parseVMRSS("Name: x\n"); err == nil {
		t.Fatal("no VmRSS parsed")
	}
}
