package main

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
)

// README's ghost check, run as written through a shell against the Redis
// of two running nodes: it counts a room's members, and after one node is
// SIGKILLed its user drops out of the count on its own, within the TTL
// and a second (until is stored in whole seconds). The seed article's
// command, in milliseconds, counts none of them on this data.
func TestE2EGhostCheckCommand(t *testing.T) {
	skipIfShort(t, "a real node's data read with redis-cli")
	w := newWorld(t, shortTiming, 2)
	_, port, _ := strings.Cut(w.rs.Addr, ":")
	count := func(cmd string) string {
		t.Helper()
		out, err := exec.Command("sh", "-c", "redis-cli -p "+port+" "+cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	const readme = `zcount 'presence:{42}' "$(date +%s.%3N)" +inf`
	const seed = `zcount 'presence:{42}' "$(date +%s000)" +inf`
	w.mustPeople("u", "42", 3) // u0 and u2 on node 0, u1 on node 1
	if got := count(readme); got != "3" {
		t.Fatalf("README's command: %q, want 3 members", got)
	}
	if got := count(seed); got != "0" {
		t.Fatalf("the seed's command: %q; README says it counts 0 here", got)
	}

	w.nodes[1].signal(syscall.SIGKILL)
	killed := time.Now()
	if err := testkit.Poll(w.timing.ttl+5*time.Second, 50*time.Millisecond, func() error { return testkit.Want("the count", count(readme), "2") }); err != nil {
		t.Fatalf("the killed node's user still counted %v after the kill: %v", time.Since(killed), err)
	}
	gone := time.Since(killed)
	// The last refresh was at most a heartbeat before the kill; until is
	// that expiry rounded up to a whole second.
	if lo, hi := w.timing.ttl-w.timing.beat-100*time.Millisecond, w.timing.ttl+time.Second+time.Second; gone < lo || gone > hi {
		t.Fatalf("the killed node's user left the count %v after the kill, want within [%v, %v]", gone, lo, hi)
	}
	t.Logf("README's ghost check: 3 members, 2 at %v after the node was killed (TTL %v); the seed's command: 0",
		gone.Round(10*time.Millisecond), w.timing.ttl)
}
