package main

import (
	"errors"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/internal/testkit"
)

// The quick start's run command: presenced dev starts its own
// redis-server and an embedded nats-server, serves the demo page and
// dev-mode WebSocket clients, logs every transition, and on SIGTERM exits
// 0 leaving nothing behind.
func TestE2EDevQuickStart(t *testing.T) {
	t.Setenv("REDIS_URL", "") // the dev node starts its own Redis
	e := &env{t: t}
	p := e.start([]string{"dev", "--listen", "127.0.0.1:0", "--nats-port", "-1", "--session-ttl", "3s", "--heartbeat", "1s", "--offline-grace", "1s", "--reap-interval", "100ms", "--last-seen-interval", "2s"}, true)
	m := regexp.MustCompile(`url=unix://(\S+)`).FindStringSubmatch(p.out.String())
	if m == nil {
		t.Fatalf("no redis-server of its own:\n%s", p.out.String())
	}
	sock := m[1]

	r, err := http.Get("http://" + p.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusOK || !strings.Contains(string(page), "/v1/ws") {
		t.Fatalf("demo page: %d %.200s", r.StatusCode, page)
	}

	c := dialURL(t, "ws://"+p.addr+"/v1/ws?session=tab1&user=alice", "alice", "tab1")
	snap := c.join("lobby")["snapshot"].(map[string]any)
	if snap["total"] != float64(1) {
		t.Fatalf("snapshot %v", snap)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		out := p.out.String()
		if !strings.Contains(out, "online") || !strings.Contains(out, "alice") {
			return errors.New("alice's online not logged yet")
		}
		return nil
	})

	// The banner's nats sub line works as printed.
	sub := regexp.MustCompile(`nats sub --server (nats://\S+) 'presence\.>'`).FindStringSubmatch(p.out.String())
	if sub == nil || !strings.Contains(p.out.String(), "offline grace 1s") {
		t.Fatalf("the banner names no NATS URL or timing:\n%s", p.out.String())
	}
	nc, err := nats.Connect(sub[1])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	events, err := nc.SubscribeSync("presence.>")
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	dialURL(t, "ws://"+p.addr+"/v1/ws?session=tab2&user=bob", "bob", "tab2").join("lobby")
	msg, err := events.NextMsg(10 * time.Second)
	if err != nil || msg.Subject != "presence.local.lobby.online.bob" {
		t.Fatalf("on the banner's NATS: %v %v", msg, err)
	}

	p.signal(syscall.SIGTERM)
	if code := p.exit(t, 15*time.Second); code != 0 {
		t.Fatalf("exit code %d\n%s", code, p.out.String())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("redis socket %s left behind: %v", sock, err)
	}
}

// SIGKILLed, presenced dev runs no cleanup: its redis-server must still
// go with it, not live on as an orphan.
func TestDevRedisDiesWithAKilledNode(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	e := &env{t: t}
	p := e.start([]string{"dev", "--listen", "127.0.0.1:0", "--nats-port", "-1"}, true)
	m := regexp.MustCompile(`url=unix://(\S+)`).FindStringSubmatch(p.out.String())
	if m == nil {
		t.Fatalf("no redis-server of its own:\n%s", p.out.String())
	}
	alive := func() bool { // a redis-server whose command line names the socket
		procs, _ := os.ReadDir("/proc")
		for _, d := range procs {
			cmdline, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
			if err == nil && strings.Contains(string(cmdline), m[1]) {
				return true
			}
		}
		return false
	}
	if !alive() {
		t.Fatal("the dev redis-server is not found by its socket")
	}
	p.signal(syscall.SIGKILL)
	p.exit(t, 15*time.Second)
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if alive() {
			return errors.New("the dev redis-server still answers on its socket")
		}
		return nil
	})
}
