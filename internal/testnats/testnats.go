// Package testnats runs real nats-server instances in-process for tests:
// random port, JetStream on, storage in a temporary directory, shut down
// by t.Cleanup. Besides a single server: a supercluster whose gateway
// links a test can cut (StartSuperCluster), a server that takes only
// JWT credentials (StartSecured), and a supercluster started from
// nats-server configuration files (StartConfigured).
package testnats

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Options returns the options Start uses, for tests that need to edit them.
func Options(tb testing.TB) *server.Options {
	tb.Helper()
	return &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		NoLog:     true,
		NoSigs:    true,
		JetStream: true,
		StoreDir:  tb.TempDir(),
	}
}

// Start runs a nats-server with JetStream and waits until it accepts
// clients.
func Start(tb testing.TB) *server.Server {
	tb.Helper()
	return StartWith(tb, Options(tb))
}

// StartWith runs a nats-server with the given options.
func StartWith(tb testing.TB, o *server.Options) *server.Server {
	tb.Helper()
	s, err := server.NewServer(o)
	if err != nil {
		tb.Fatalf("nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		tb.Fatal("nats-server not ready in 10s")
	}
	tb.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// Connect returns a client connection to s, closed at cleanup.
func Connect(tb testing.TB, s *server.Server) *nats.Conn {
	tb.Helper()
	// The client's default 2 s for the handshake is short for a loaded
	// machine running the server in the test process under -race.
	nc, err := nats.Connect(s.ClientURL(), nats.Timeout(10*time.Second))
	if err != nil {
		tb.Fatalf("connect %s: %v", s.ClientURL(), err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// Run starts a nats-server as Start does, for code that has no testing.TB
// (an example function): stop shuts it down and removes its store.
func Run() (s *server.Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "testnats-")
	if err != nil {
		return nil, nil, err
	}
	s, err = server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, JetStream: true, StoreDir: dir,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("nats-server: %w", err)
	}
	go s.Start()
	stop = func() { s.Shutdown(); s.WaitForShutdown(); _ = os.RemoveAll(dir) }
	if !s.ReadyForConnections(10 * time.Second) {
		stop()
		return nil, nil, errors.New("nats-server not ready in 10s")
	}
	return s, stop, nil
}
