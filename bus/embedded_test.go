package bus_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// lockedBuffer is a log sink shared with the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestStartEmbedded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "js")
	var logs lockedBuffer
	s, err := bus.StartEmbedded(bus.EmbeddedConfig{Port: -1, StoreDir: dir, ServerName: "presence-test",
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
	e := newEnvOn(t, nc, "eu")
	if _, err := e.pub.Publish(t.Context(), []presence.Transition{tr("eu", "r", "u", presence.Online, 1)}); err != nil {
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
	if info := streamInfo(t, e.stream); info.Config.Storage != jetstream.FileStorage || info.State.Msgs != 1 {
		t.Fatalf("stream: %+v %+v", info.Config, info.State)
	}
}

func TestStartEmbeddedSideBySide(t *testing.T) {
	// Two servers on random ports with their own dirs, no logger.
	for range 2 {
		s, err := bus.StartEmbedded(bus.EmbeddedConfig{Port: -1, StoreDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	}
}

func TestEmbeddedConfig(t *testing.T) {
	c := bus.EmbeddedConfig{}.WithDefaults()
	if c.Host != "127.0.0.1" || c.Port != 4222 || c.StoreDir != filepath.Join(os.TempDir(), "presence-nats") {
		t.Fatalf("defaults: %+v", c)
	}
	for _, bad := range []bus.EmbeddedConfig{{Port: -2}, {Port: 70000}} {
		_, err := bus.StartEmbedded(bad)
		var ce *presence.ConfigError
		if !errors.As(err, &ce) || ce.Field != "port" || !strings.HasPrefix(err.Error(), "presence: config: port") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}
