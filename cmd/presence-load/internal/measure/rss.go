package measure

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RSSWatch samples a process's RSS every second, keeping the peak.
type RSSWatch struct {
	pid  int
	mu   sync.Mutex
	peak int64
	done chan struct{}
}

// WatchRSS samples process pid's RSS until Stop, keeping the peak.
func WatchRSS(pid int) *RSSWatch {
	w := &RSSWatch{pid: pid, done: make(chan struct{})}
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			w.sample()
			select {
			case <-t.C:
			case <-w.done:
				return
			}
		}
	}()
	return w
}

func (w *RSSWatch) sample() int64 {
	v, err := procRSS(w.pid)
	if err != nil {
		return 0
	}
	w.mu.Lock()
	w.peak = max(w.peak, v)
	w.mu.Unlock()
	return v
}

// Now samples and returns the RSS and the peak so far, and resets the peak.
func (w *RSSWatch) Now() (cur, peak int64) {
	if w == nil {
		return 0, 0
	}
	cur = w.sample()
	w.mu.Lock()
	defer w.mu.Unlock()
	peak, w.peak = w.peak, cur
	return cur, peak
}

// Stop stops the sampling.
func (w *RSSWatch) Stop() { close(w.done) }

// procRSS reads VmRSS of /proc/<pid>/status, in bytes.
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseVMRSS(string(b))
}

func parseVMRSS(status string) (int64, error) {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) < 1 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// Codes64 is Codes for 64-bit counts.
func Codes64(m map[string]int64) string {
	c := map[string]int{}
	for k, v := range m {
		c[k] = int(v)
	}
	return Codes(c)
}

// Samples spreads k indices over 0..n-1.
func Samples(n, k int) []int {
	k = min(k, n)
	s := make([]int, 0, k)
	for j := range k {
		s = append(s, j*n/k+n/(2*k))
	}
	return s
}

// ToDurations turns µs into sorted durations.
func ToDurations(us []int64) []time.Duration {
	d := make([]time.Duration, len(us))
	for i, v := range us {
		d[i] = time.Duration(v) * time.Microsecond
	}
	slices.Sort(d)
	return d
}
