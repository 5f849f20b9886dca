package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
)

// A node started before NATS answers does not exit: it listens at once,
// reports 503 "starting" with what it waits for, and becomes healthy
// when NATS comes up.
func TestE2ENodeWaitsForNATS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	e := &env{t: t, redis: testredis.Start(t).Addr, nats: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	p := e.start([]string{"node", "--region", "eu", "--redis", e.redis, "--nats", e.nats, "--listen", "127.0.0.1:0",
		"--jwt-secret", e2eSecret}, false)
	waitFor(t, 15*time.Second, "the node to listen", func() bool {
		m := listening.FindStringSubmatch(p.out.String())
		if m != nil {
			p.addr = m[1]
		}
		return m != nil
	})
	health := func() (int, map[string]string) {
		r, err := http.Get("http://" + p.addr + "/healthz")
		if err != nil {
			return 0, nil
		}
		defer r.Body.Close()
		var h map[string]string
		_ = json.NewDecoder(r.Body).Decode(&h)
		return r.StatusCode, h
	}
	waitFor(t, 10*time.Second, "health to say it waits for nats", func() bool {
		code, h := health()
		return code == http.StatusServiceUnavailable && h["status"] == "starting" && h["waiting_for"] == "nats"
	})
	o := testnats.Options(t)
	o.Port = port
	testnats.StartWith(t, o)
	waitFor(t, 20*time.Second, "the node to become healthy", func() bool {
		code, _ := health()
		return code == http.StatusOK
	})
	c := dial(t, p.addr, "late", "tab")
	c.join("lobby")
}
