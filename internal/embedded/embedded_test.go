package embedded_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/embedded"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

func TestStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "js")
	var logs testkit.LockedBuffer
	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir, ServerName: "presence-test",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.JetStreamEnabled() || s.Name() != "presence-test" {
		t.Fatalf("jetstream %v, name %q", s.JetStreamEnabled(), s.Name())
	}
	if got := s.StoreDir(); !strings.HasPrefix(got, dir) {
		t.Fatalf("store dir %q, want under %q", got, dir)
	}
	if !strings.HasPrefix(s.ClientURL(), "nats://127.0.0.1:") || strings.HasSuffix(s.ClientURL(), ":4222") {
		t.Fatalf("client url %s", s.ClientURL())
	}
	if !strings.Contains(logs.String(), "Starting nats-server") {
		t.Fatalf("logger got nothing: %q", logs.String())
	}

	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := bus.EnsureStream(ctx, js, bus.StreamConfig{Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	at := time.UnixMilli(1764444000001)
	tr := presence.Transition{
		ID: fmt.Sprintf("eu/r/%d/1", at.UnixMilli()-1), Region: "eu", Room: "r", User: "u", Kind: presence.Online,
		Reason: presence.Joined, Sessions: 1, Seq: 1, Epoch: at.UnixMilli() - 1, At: at,
	}
	if _, err := bus.NewPublisher(js, "eu").Publish(ctx, []presence.Transition{tr}); err != nil {
		t.Fatal(err)
	}
	// File storage lands in the given dir.
	found := false
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == bus.StreamName("eu") {
			found = true
		}
		return nil
	})
	if !found {
		t.Fatalf("no %s directory under %s", bus.StreamName("eu"), dir)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Storage != jetstream.FileStorage || info.State.Msgs != 1 {
		t.Fatalf("stream: %+v %+v", info.Config, info.State)
	}
}

func TestStartSideBySide(t *testing.T) {
	// Two servers on random ports with their own dirs, no logger.
	for range 2 {
		s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	}
}

func TestConfig(t *testing.T) {
	c := embedded.Config{}.WithDefaults()
	if c.Host != "127.0.0.1" || c.Port != 4222 || c.StoreDir != filepath.Join(os.TempDir(), "presence-nats") {
		t.Fatalf("defaults: %+v", c)
	}
	for _, bad := range []embedded.Config{{Port: -2}, {Port: 70000}} {
		t.Run(fmt.Sprint(bad.Port), func(t *testing.T) {
			_, err := embedded.Start(bad)
			var ce *presence.ConfigError
			if !errors.As(err, &ce) || ce.Field != "port" || !strings.HasPrefix(err.Error(), "presence: config: port") {
				t.Errorf("%+v: %v", bad, err)
			}
		})
	}
}

// A port in use is reported at once, with the listener's own error, not
// after the readiness timeout.
func TestStartPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	start := time.Now()
	s, err := embedded.Start(embedded.Config{Port: port, StoreDir: t.TempDir()})
	if err == nil {
		s.Shutdown()
		t.Fatal("started on a port in use")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("reported after %v", took)
	}
	if !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Fatalf("error %q names neither the cause nor the port", err)
	}
}
