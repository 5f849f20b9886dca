package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait() // killed: its exit status says nothing
	})
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	var nc *nats.Conn
	deadline := time.Now().Add(30 * time.Second)
	for {
		if nc, err = nats.Connect(url); err == nil {
			if _, err = nc.JetStream(); err == nil {
				if _, err = nc.Request("$JS.API.INFO", nil, 2*time.Second); err == nil {
					break
				}
			}
			nc.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server at %s did not answer: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Cleanup(nc.Close)
	return &env{t: t, redis: rs.Addr, nats: url, nc: nc}
}
