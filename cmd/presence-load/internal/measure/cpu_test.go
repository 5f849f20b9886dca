package measure

import (
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, ms(float64(i)))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{.5, ms(50)}, {.9, ms(90)}, {.99, ms(99)}, {1, ms(100)}, {.001, ms(1)}} {
		if got := Percentile(lat, c.q); got != c.want {
			t.Errorf("p%v of 1..100ms = %v, want %v", c.q*100, got, c.want)
		}
	}
	if got := Percentile(nil, .99); got != 0 {
		t.Errorf("percentile of nothing = %v, want 0", got)
	}
	if got := Percentile([]time.Duration{ms(7)}, .5); got != ms(7) {
		t.Errorf("p50 of one value = %v", got)
	}
	// Two joins of 100 never seen: p99 is never, p98 a measured value.
	lat = append(lat[:98], Never, Never)
	if got := Percentile(lat, .99); got != Never {
		t.Errorf("p99 with 2%% never seen = %v, want never", got)
	}
	if got := Percentile(lat, .98); got != ms(98) {
		t.Errorf("p98 with 2%% never seen = %v, want 98ms", got)
	}
}

func TestParseProcStat(t *testing.T) {
	// The command name may hold spaces and parentheses.
	line := "4242 (nats (srv) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 12 0 9999 123456 789 18446744073709551615"
	got, err := ParseProcStat(line)
	if err != nil || got != 3.25 {
		t.Fatalf("parseProcStat = %v, %v; want 3.25s", got, err)
	}
	if _, err := ParseProcStat("garbage"); err == nil {
		t.Fatal("garbage parsed")
	}
}

func TestParseRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9.0\r\nused_cpu_user_children:9.0\r\nused_cpu_sys_main_thread:1.4\r\n"
	got, err := ParseRedisCPU(info)
	if err != nil || got != 3.75 {
		t.Fatalf("parseRedisCPU = %v, %v; want 3.75", got, err)
	}
	if _, err := ParseRedisCPU("# CPU\r\n"); err == nil {
		t.Fatal("empty INFO parsed")
	}
}

func TestParseProcTimes(t *testing.T) {
	line := "77 (go test) S 1 77 77 0 -1 0 0 0 0 0 150 50 300 100 20 0 9 0 4242 0 0"
	got, err := parseProcTimes(line)
	if err != nil || got != (procTimes{Start: 4242, Own: 2, Kids: 4}) {
		t.Fatalf("parseProcTimes = %+v, %v", got, err)
	}
}

func ms(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }

// What the hypervisor took is printed apart: it is no process's, so it
// is neither in the processes' sum nor in what they leave unexplained.
func TestStealIsPrintedApartFromTheProcesses(t *testing.T) {
	rs := []Reading{{Name: "node", Secs: 5}, {Name: "machine", Secs: 8}, {Name: StealName, Secs: 1}, {Name: "load tool", Secs: 2}}
	got := FmtCPU(rs, 10*time.Second)
	want := "node 50.0%, load tool 20.0%, whole machine 80.0% (everything else 10.0%), stolen by the hypervisor 10.0%"
	if got != want {
		t.Errorf("FmtCPU = %q, want %q", got, want)
	}
	if other, ok := OtherCPU(rs, 10*time.Second); !ok || other != 10 {
		t.Errorf("OtherCPU = %v, %v; want 10, true", other, ok)
	}
	if s, err := readSteal(); err != nil || s < 0 {
		t.Errorf("readSteal on this machine: %v, %v", s, err)
	}
}
