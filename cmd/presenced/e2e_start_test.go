package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
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
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		m := listening.FindStringSubmatch(p.out.String())
		if m != nil {
			p.addr = m[1]
		}
		if m == nil {
			return errors.New("no listening line in the node's log yet")
		}
		return nil
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
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		code, h := health()
		if code != http.StatusServiceUnavailable || h["status"] != "starting" || h["waiting_for"] != "nats" {
			return fmt.Errorf("health %d %v, want 503 starting, waiting for nats", code, h)
		}
		return nil
	})
	o := testnats.Options(t)
	o.Port = port
	testnats.StartWith(t, o)
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		code, _ := health()
		return testkit.Want("the node's health", code, http.StatusOK)
	})
	c := dial(t, p.addr, "late", "tab")
	c.join("lobby")
}

// A node started on a region holding data of the format before versions
// (a reap index, no presence:schema) exits at once with a message naming
// the format, instead of reading it (older data's until in ms would read
// as seconds far ahead: ghosts) or waiting; the same node with a new
// --redis-prefix starts on an empty keyspace.
func TestE2ENodeRefusesARegionOfAnotherFormat(t *testing.T) {
	e := newEnv(t)
	rdb := redis.NewClient(&redis.Options{Addr: e.redis})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.ZAdd(ctx, "presence:reap", redis.Z{Score: 1, Member: "presence:{lobby}"}).Err(); err != nil {
		t.Fatal(err)
	}
	args := []string{"node", "--region", "eu", "--redis", e.redis, "--nats", e.nats, "--listen", "127.0.0.1:0", "--jwt-secret", e2eSecret}
	p := e.start(args, false)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the node did not exit on data of another format:\n%s", p.out.String())
	}
	if p.err == nil || !strings.Contains(p.out.String(), "is of format 1, this store reads format 2") {
		t.Fatalf("exit %v, output:\n%s", p.err, p.out.String())
	}
	if n, _ := rdb.Exists(ctx, "presence:schema").Result(); n != 0 {
		t.Fatal("the refused node wrote the format key")
	}
	p2 := e.start(append(args, "--redis-prefix", "presence2"), true)
	c := dial(t, p2.addr, "u", "tab")
	c.join("lobby")
	if v, _ := rdb.Get(ctx, "presence2:schema").Result(); v != "2" {
		t.Fatalf("presence2:schema = %q, want 2", v)
	}
}

// An embedded nats-server whose port is taken ends the start at once with
// the listener's error, as a taken HTTP port does.
func TestE2EEmbeddedNATSPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	e := &env{t: t, redis: testredis.Start(t).Addr}
	start := time.Now()
	p := e.start([]string{"node", "--region", "eu", "--redis", e.redis, "--nats-port", fmt.Sprint(port),
		"--nats-store-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--jwt-secret", e2eSecret}, false)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the node did not exit on a taken NATS port:\n%s", p.out.String())
	}
	if took := time.Since(start); took > 8*time.Second {
		t.Fatalf("exit after %v: a taken port is not a timeout", took)
	}
	if p.err == nil || !strings.Contains(p.out.String(), "address already in use") {
		t.Fatalf("exit %v, output:\n%s", p.err, p.out.String())
	}
}
