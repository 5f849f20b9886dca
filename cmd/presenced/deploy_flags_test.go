package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
)

// The embedded nats-server's cluster flags are checked before anything
// starts: a cluster the server could not form is a usage error (exit 2)
// naming what is missing, not a node waiting for ever.
func TestNodeEmbeddedClusterFlagsAreChecked(t *testing.T) {
	base := []string{"node", "--insecure-dev", "--region", "eu", "--listen", "127.0.0.1:0", "--nats-port", "-1", "--nats-store-dir", t.TempDir()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nats-cluster-listen", "127.0.0.1:6222", "--nats-routes", "nats-route://127.0.0.1:6222"}, "server name"},
		{[]string{"--nats-server-name", "eu-1", "--nats-routes", "nats-route://127.0.0.1:6222"}, "cluster listen"},
		{[]string{"--nats-server-name", "eu-1", "--nats-cluster-listen", "127.0.0.1:6222"}, "routes"},
		{[]string{"--nats-server-name", "eu-1", "--nats-cluster-listen", "127.0.0.1:6222", "--nats-routes", "nats-route://127.0.0.1:6222",
			"--nats-gateways", "us=nats://127.0.0.1:7222"}, "gateway listen"},
		{[]string{"--nats-server-name", "eu-1", "--nats-cluster-listen", "127.0.0.1:6222", "--nats-routes", "nats-route://127.0.0.1:6222",
			"--nats-gateway-listen", "127.0.0.1:7222", "--nats-gateways", "nats://127.0.0.1:7222"}, "want region=nats://host:port"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--nats-cluster-listen", "127.0.0.1:6222"}, "not with --nats"},
	} {
		expectUsageError(t, append(append([]string{}, base...), tc.args...), tc.want)
	}
	// The demo page gets its tokens from /dev/token: only a dev node has it.
	expectUsageError(t, []string{"node", "--demo", "--jwt-secret", e2eSecret}, "--demo needs --insecure-dev")
}

func expectUsageError(t *testing.T, args []string, want string) {
	t.Helper()
	out, err := exec.Command(binary, args...).CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), want) {
		t.Errorf("%v: %v, want exit 2 naming %q:\n%s", args, err, want, out)
	}
}

// An aggregator started before its NATS answers does not exit (in a
// compose file or a pod it starts beside NATS): health says
// "nats_disconnected" until NATS comes up, then "ok".
func TestE2EAggregatorWaitsForNATS(t *testing.T) {
	port := freeTCPPort(t)
	e := &env{t: t}
	p := e.start([]string{"aggregator", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port), "--regions", "eu", "--listen", "127.0.0.1:0"}, false)
	var addr string
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		if m := aggregatorHTTP.FindStringSubmatch(p.out.String()); m != nil {
			addr = m[1]
		}
		if addr == "" {
			return errors.New("no aggregator http line in its log yet")
		}
		return nil
	})
	status := func() (int, string) {
		var h struct{ Status string }
		r, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return 0, ""
		}
		defer r.Body.Close()
		_ = json.NewDecoder(r.Body).Decode(&h)
		return r.StatusCode, h.Status
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if code, s := status(); code != http.StatusServiceUnavailable || s != "nats_disconnected" {
			return fmt.Errorf("health %d %q, want 503 nats_disconnected", code, s)
		}
		return nil
	})
	o := testnats.Options(t)
	o.Port = port
	testnats.StartWith(t, o)
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if code, s := status(); code != http.StatusOK || s != "ok" {
			return fmt.Errorf("health %d %q, want 200 ok", code, s)
		}
		return nil
	})
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
