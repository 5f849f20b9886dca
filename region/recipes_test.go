package region

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testredis"
)

// The redis-cli recipes of the package doc, run as written.
func TestRedisCliRecipes(t *testing.T) {
	rdb, srv := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	touch(t, s, ref("room42", "u_8827", "tabA"), ref("room42", "u_8827", "tabB"), ref("room42", "u_1", "x"))
	_, port, _ := strings.Cut(srv.Addr, ":")
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("redis-cli", append([]string{"-p", port}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	ms := time.Now().UnixMilli()
	now := fmt.Sprintf("%d.%03d", ms/1000, ms%1000) // what "$(date +%s.%3N)" prints
	if got := cli("zcount", "presence:{room42}", now, "+inf"); got != "2" {
		t.Fatalf("zcount: %q, want 2 live members", got)
	}
	got := cli("zscan", "presence:{room42}:s", "0", "match", "u_8827:*", "count", "100000")
	lines := strings.Split(got, "\n")
	if len(lines) != 5 || lines[0] != "0" {
		t.Fatalf("zscan: %q, want cursor 0 and two sessions with expiry", got)
	}
	for i := 1; i < 5; i += 2 {
		exp, err := strconv.ParseInt(lines[i+1], 10, 64)
		if !strings.HasPrefix(lines[i], "u_8827:tab") || err != nil || time.Until(time.Unix(exp, 0)) <= 0 {
			t.Fatalf("zscan entry %q %q: want u_8827:tabX and a future unix time", lines[i], lines[i+1])
		}
	}
	if n, _ := rdb.ZCount(context.Background(), "presence:{room42}", fmt.Sprint(time.Now().Unix()), "+inf").Result(); n != 2 {
		t.Fatalf("zcount via client: %d", n)
	}
	if got := cli("hgetall", "presence:holders"); len(strings.Split(got, "\n")) != 2 || len(strings.Split(got, "|")) != 5 {
		t.Fatalf("hgetall presence:holders: %q, want one code and its lease", got)
	}
}
