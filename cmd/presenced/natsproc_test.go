package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
)

// natsBinary is a nats-server built once from the module this project
// depends on, for tests that want it in its own process: in the test
// binary it would run under the race detector, several times slower than
// in production, and take the CPU the presenced processes need.
var natsBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "presenced-e2e-nats-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nats-server")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput()
	if err != nil {
		return "", &buildError{err, out}
	}
	return bin, nil
})

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string {
	return "build nats-server: " + e.err.Error() + "\n" + string(e.out)
}

// newProcessEnv is newEnv with nats-server (JetStream on) in its own
// process.
func newProcessEnv(t *testing.T) *env {
	t.Helper()
	bin, err := natsBinary()
	if err != nil {
		t.Fatal(err)
	}
	rs := testredis.Start(t)
	// The server picks its own port and names it in a ports file: a
	// port probed here and bound there could be taken in between by a
	// test running beside this one.
	dir := t.TempDir()
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", filepath.Join(dir, "store"), "--ports_file_dir", dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait() // killed: its exit status says nothing
	})
	portsFile := filepath.Join(dir, fmt.Sprintf("nats-server_%d.ports", cmd.Process.Pid))
	var url string
	var nc *nats.Conn
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if url == "" {
			url = readPortsFile(portsFile)
		}
		if url == "" {
			return fmt.Errorf("no url in the ports file %s", portsFile)
		}
		if nc, err = nats.Connect(url); err != nil {
			return fmt.Errorf("nats-server at %s: %w", url, err)
		}
		if _, err = nc.Request("$JS.API.INFO", nil, 2*time.Second); err != nil {
			nc.Close()
			return fmt.Errorf("nats-server at %s: JetStream: %w", url, err)
		}
		return nil
	})
	t.Cleanup(nc.Close)
	return &env{t: t, redis: rs.Addr, nats: url, nc: nc}
}

// readPortsFile returns the client URL a nats-server wrote to its ports
// file, or "" while there is none yet.
func readPortsFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var ports struct {
		Nats []string `json:"nats"`
	}
	if json.Unmarshal(b, &ports) != nil || len(ports.Nats) == 0 {
		return ""
	}
	return ports.Nats[0]
}
