package measure

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Meter reads a process's cumulative CPU time in seconds. Every meter
// is cumulative, so CPU over a window is the difference of two reads.
type Meter struct {
	Name   string // node, redis, nats, load tool, hog
	Source string // how it is read, printed with the figure
	Read   func() (float64, error)
}

// Reading is one read of a meter.
type Reading struct {
	Name, Source string
	Secs         float64
	Err          error
}

func tvSecs(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// ProcMeter reads process pid's CPU from /proc.
func ProcMeter(name string, pid int) Meter {
	return Meter{Name: name, Source: fmt.Sprintf("/proc/%d/stat utime+stime", pid), Read: func() (float64, error) { return ProcCPU(pid) }}
}

// ReadMeters reads every meter once.
func ReadMeters(ms []Meter) []Reading {
	rs := make([]Reading, len(ms))
	for i, m := range ms {
		v, err := m.Read()
		rs[i] = Reading{Name: m.Name, Source: m.Source, Secs: v, Err: err}
	}
	return rs
}

// Delta is b - a, meter by meter. A meter added after a was read (a
// process started meanwhile) counts from 0.
func Delta(a, b []Reading) []Reading {
	d := make([]Reading, len(b))
	for i := range b {
		d[i] = b[i]
		if i >= len(a) {
			continue
		}
		d[i].Secs = b[i].Secs - a[i].Secs
		d[i].Err = errors.Join(a[i].Err, b[i].Err)
	}
	return d
}

// OtherCPU is the CPU, in % of one core over the window, of the processes
// no meter names (machine minus the rest); false without a machine meter.
func OtherCPU(rs []Reading, window time.Duration) (float64, bool) {
	var known, machine float64
	have := false
	for _, r := range rs {
		if r.Err != nil {
			continue
		}
		switch r.Name {
		case "machine":
			machine, have = r.Secs, true
		case StealName:
		default:
			known += r.Secs
		}
	}
	if !have || window <= 0 {
		return 0, false
	}
	return max(machine-known, 0) / window.Seconds() * 100, true
}

// FmtCPU prints each meter's CPU over the window as a percentage of one
// core. The machine meter is followed by what the other meters do not
// explain: other processes on the machine (tests, builds, a hog without a
// meter), which disturb the figures.
func FmtCPU(rs []Reading, window time.Duration) string {
	var parts []string
	var known, machine float64
	haveMachine := false
	steal := ""
	for _, r := range rs {
		if r.Err != nil {
			parts = append(parts, fmt.Sprintf("%s ? (%v)", r.Name, r.Err))
			continue
		}
		pct := r.Secs / window.Seconds() * 100
		if r.Name == "machine" {
			machine, haveMachine = pct, true
			continue
		}
		if r.Name == StealName {
			steal = fmt.Sprintf("%s %.1f%%", r.Name, pct)
			continue
		}
		known += pct
		parts = append(parts, fmt.Sprintf("%s %.1f%%", r.Name, pct))
	}
	if haveMachine {
		parts = append(parts, fmt.Sprintf("whole machine %.1f%% (everything else %.1f%%)", machine, max(machine-known, 0)))
	}
	if steal != "" {
		parts = append(parts, steal)
	}
	return strings.Join(parts, ", ")
}

// allProcs is a meter over every process on the machine, from
// /proc/<pid>/stat (whose times the kernel keeps exact): a sampler scans
// /proc every 250 ms and adds each process's own CPU since its previous
// sample, or all of it for a process that appeared since. A process that
// exits loses at most its last 250 ms, and one that lives less than that
// is missed: the figure errs low. Reaped children's times are not used:
// they would bring in the whole life of a child that started long before.
// (/proc/stat's machine-wide counters are sampled on timer ticks and
// undercount bursty loads such as these, so they are not used either.)
type allProcs struct {
	mu    sync.Mutex
	last  map[int]procTimes
	total float64
	err   error
}

type procTimes struct {
	Start     uint64  // start time in ticks since boot: tells a reused pid
	Own, Kids float64 // seconds
}

func newAllProcs() *allProcs {
	a := &allProcs{}
	a.sample()
	go func() {
		for range time.Tick(250 * time.Millisecond) {
			a.sample()
		}
	}()
	return a
}

func (a *allProcs) sample() {
	now, err := scanProcs()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err = err; err != nil {
		return
	}
	if a.last != nil {
		for pid, t := range now {
			if p, ok := a.last[pid]; ok && p.Start == t.Start {
				a.total += max(t.Own-p.Own, 0)
			} else {
				a.total += t.Own
			}
		}
	}
	a.last = now
}

func (a *allProcs) Read() (float64, error) {
	a.sample()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.total, a.err
}

func scanProcs() (map[int]procTimes, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	m := make(map[int]procTimes, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		if t, err := parseProcTimes(string(b)); err == nil {
			m[pid] = t
		}
	}
	return m, nil
}

// parseProcTimes reads utime+stime, cutime+cstime and the start time of
// a /proc/<pid>/stat line.
func parseProcTimes(s string) (procTimes, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procTimes{}, errors.New("malformed /proc stat")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime..cstime are fields 14-17, starttime 22.
	if len(f) < 20 {
		return procTimes{}, errors.New("short /proc stat")
	}
	var v [5]uint64
	for j, k := range []int{11, 12, 13, 14, 19} {
		n, err := strconv.ParseUint(f[k], 10, 64)
		if err != nil {
			return procTimes{}, err
		}
		v[j] = n
	}
	return procTimes{Start: v[4], Own: float64(v[0]+v[1]) / clkTck, Kids: float64(v[2]+v[3]) / clkTck}, nil
}

// clkTck is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture Go supports (the kernel's ABI fixes it; nats-server
// assumes the same).
const clkTck = 100

// ProcCPU reads a process's utime+stime from /proc/<pid>/stat.
func ProcCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return ParseProcStat(string(b))
}

// ParseProcStat returns utime+stime in seconds. The command name, in
// parentheses, may hold spaces: fields are counted after its last ')'.
func ParseProcStat(s string) (float64, error) {
	t, err := parseProcTimes(s)
	return t.Own, err
}

// RedisCPU reads used_cpu_sys + used_cpu_user from Redis's INFO cpu.
// addr is host:port or a redis:// URL (a password in it is sent with AUTH).
func RedisCPU(addr string) (float64, error) {
	var pass string
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return 0, err
		}
		addr = u.Host
		pass, _ = u.User.Password()
	}
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if pass != "" {
		if _, err := fmt.Fprintf(c, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(pass), pass); err != nil {
			return 0, err
		}
		if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+") {
			return 0, fmt.Errorf("redis AUTH: %q %v", line, err)
		}
	}
	if _, err := c.Write([]byte("*2\r\n$4\r\nINFO\r\n$3\r\ncpu\r\n")); err != nil {
		return 0, err
	}
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if !strings.HasPrefix(head, "$") {
		return 0, fmt.Errorf("redis INFO: %q", strings.TrimSpace(head))
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil {
		return 0, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	return ParseRedisCPU(string(body))
}

// ParseRedisCPU sums used_cpu_sys and used_cpu_user of an INFO reply
// (the main thread's and children's are separate fields, not summed).
func ParseRedisCPU(info string) (float64, error) {
	var sum float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("redis INFO %s: %w", k, err)
		}
		sum += f
		found++
	}
	if found != 2 {
		return 0, errors.New("redis INFO cpu: used_cpu_sys or used_cpu_user missing")
	}
	return sum, nil
}

// VarzMeter integrates nats-server's /varz "cpu" (a percentage the server
// recomputes about once a second over the last second) into CPU seconds,
// polling every second. It is an estimate; --nats-pid reads the exact
// figure from /proc.
func VarzMeter(monitor string) (Meter, error) {
	u := strings.TrimSuffix(monitor, "/") + "/varz"
	get := func() (float64, error) {
		resp, err := http.Get(u)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var v struct {
			CPU float64 `json:"cpu"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			return 0, err
		}
		return v.CPU, nil
	}
	if _, err := get(); err != nil {
		return Meter{}, err
	}
	var mu sync.Mutex
	var total float64
	var lastErr error
	last := time.Now()
	go func() {
		for range time.Tick(time.Second) {
			pct, err := get()
			now := time.Now()
			mu.Lock()
			if err == nil {
				total += pct / 100 * now.Sub(last).Seconds()
			}
			lastErr, last = err, now
			mu.Unlock()
		}
	}()
	return Meter{Name: "nats", Source: u + " cpu, sampled each second", Read: func() (float64, error) {
		mu.Lock()
		defer mu.Unlock()
		return total, lastErr
	}}, nil
}

// Scrape reads a Prometheus text page; each metric name maps to the sum
// of its series (labels dropped).
func Scrape(u string) (map[string]float64, error) {
	m := map[string]float64{}
	err := scrapeLines(u, func(line string) {
		if line == "" || line[0] == '#' {
			return
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			return
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			// Labels may hold spaces: the value follows the closing brace.
			j := strings.LastIndexByte(line, '}')
			name, val = line[:i], strings.TrimSpace(line[j+1:])
		}
		fields := strings.Fields(val)
		if len(fields) == 0 {
			return
		}
		if f, err := strconv.ParseFloat(fields[0], 64); err == nil {
			m[name] += f
		}
	})
	return m, err
}

// scrapeLines hands each line of the Prometheus text page at u to line.
func scrapeLines(u string, line func(string)) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line(sc.Text())
	}
	return sc.Err()
}

// MachineMeter reads the CPU of every process on the machine (allProcs).
func MachineMeter() Meter {
	return Meter{Name: "machine", Source: "every process in /proc, sampled every 250ms", Read: newAllProcs().Read}
}

// StealMeter reads the CPU time the hypervisor gave other guests while
// this machine's vCPUs wanted it (/proc/stat's steal, in USER_HZ ticks of
// 10 ms): on a shared VM, a run with much of it was slowed from outside.
// It counts in no process, so it is printed apart from them.
func StealMeter() Meter {
	return Meter{Name: StealName, Source: "/proc/stat steal", Read: readSteal}
}

// StealName is the steal meter's name.
const StealName = "stolen by the hypervisor"

func readSteal() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: no steal in %q", line)
	}
	ticks, err := strconv.ParseFloat(f[8], 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/stat steal: %w", err)
	}
	return ticks / 100, nil
}

// SelfMeter reads this process's CPU.
func SelfMeter() Meter {
	return Meter{Name: "load tool", Source: "getrusage", Read: func() (float64, error) {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return 0, err
		}
		return tvSecs(ru.Utime) + tvSecs(ru.Stime), nil
	}}
}
