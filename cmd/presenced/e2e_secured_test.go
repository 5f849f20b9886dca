package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// A NATS that takes only JWT credentials, as managed NATS services do:
// with --nats-creds the node runs and its transitions flow; without, it
// stops at start; with a missing file, it is a usage error (exit 2).
func TestE2ESecuredNATS(t *testing.T) {
	ns, creds := testnats.StartSecured(t)
	nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e := &env{t: t, redis: testredis.Start(t).Addr, nats: ns.ClientURL(), nc: nc}
	w := e.watch()

	n := e.startNode("--nats-creds", creds)
	c := dial(t, n.addr, "sam", "tab")
	c.join("lobby")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return w.WantOf(presence.Online, "lobby", "sam", 1)
	})

	stranger := e.start([]string{"node", "--redis", e.redis, "--nats", e.nats, "--jwt-secret", e2eSecret, "--listen", "127.0.0.1:0"}, false)
	if code := stranger.exit(t, 15*time.Second); code != 1 || !strings.Contains(strings.ToLower(stranger.out.String()), "authorization") {
		t.Fatalf("without credentials: exit %d\n%s", code, stranger.out.String())
	}
	missing := e.start([]string{"node", "--redis", e.redis, "--nats", e.nats, "--jwt-secret", e2eSecret,
		"--nats-creds", filepath.Join(t.TempDir(), "none.creds")}, false)
	if code := missing.exit(t, 10*time.Second); code != 2 || !strings.Contains(missing.out.String(), "--nats-creds") {
		t.Fatalf("missing creds file: exit %d\n%s", code, missing.out.String())
	}
}
