package webhook

import (
	"bufio"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// hostileFailure runs endpoint ep until an attempt fails with failure,
// and checks none was counted delivered.
func hostileFailure(t *testing.T, ep Endpoint, failure string) {
	t.Helper()
	e := newEnv(t, "eu")
	_, reg := e.dispatcher(config(t, ep))
	waitLanes(t, e, ep.Name, "eu")
	e.publish(e.transition("eu", "r", "u", presence.Online))
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		return testkit.AtLeast("failures "+failure, failureCount(reg, ep.Name, failure), 1)
	})
	if got := gauge(reg, "presence_webhook_deliveries_total", ep.Name); got != 0 {
		t.Errorf("%v deliveries counted", got)
	}
}

// failureCount is failures_total of endpoint with the given status label.
func failureCount(reg *prometheus.Registry, endpoint, status string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "presence_webhook_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ep, st string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "endpoint":
					ep = l.GetValue()
				case "status":
					st = l.GetValue()
				}
			}
			if ep == endpoint && st == status {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A redirect is a failure, and its target is never requested.
func TestHostileRedirectIsNotFollowed(t *testing.T) {
	var target atomic.Int64
	to := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { target.Add(1) }))
	t.Cleanup(to.Close)
	from := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, to.URL, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(from.Close)
	hostileFailure(t, endpoint("redir", from.URL), "307")
	if target.Load() != 0 {
		t.Error("the redirect was followed")
	}
}

// A 2xx with a huge or endless body is a delivery: the body is read up
// to the limit, never more, and the attempt does not wait for its end.
func TestHostileHugeAndEndlessBodies(t *testing.T) {
	for name, endless := range map[string]bool{"huge": false, "endless": true} {
		t.Run(name, func(t *testing.T) {
			var sent atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusOK)
				chunk := []byte(strings.Repeat("x", 32<<10))
				for i := 0; endless || i < 32<<5; i++ { // 32 MiB, or until the client leaves
					if _, err := w.Write(chunk); err != nil {
						return
					}
					sent.Add(int64(len(chunk)))
				}
			}))
			t.Cleanup(srv.Close)
			e := newEnv(t, "eu")
			_, reg := e.dispatcher(config(t, endpoint("big", srv.URL)))
			waitLanes(t, e, "big", "eu")
			e.publish(e.transition("eu", "r", "u", presence.Online))
			testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
				return testkit.Want("presence_webhook_deliveries_total{big}", gauge(reg, "presence_webhook_deliveries_total", "big"), 1)
			})
			// The server writes into socket buffers until the client
			// closes: a few MiB at most, not the 32 MiB or endless body.
			if n := sent.Load(); n > 8<<20 {
				t.Errorf("the server wrote %d bytes before the dispatcher left", n)
			}
		})
	}
}

// A receiver that sends its answer a byte a second is cut off at the
// endpoint's timeout.
func TestHostileSlowlorisIsCutOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = http.ReadRequest(bufio.NewReader(c))
				for _, b := range []byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") {
					if _, err := c.Write([]byte{b}); err != nil {
						return
					}
					time.Sleep(time.Second)
				}
			}()
		}
	}()
	start := time.Now()
	hostileFailure(t, endpoint("loris", "http://"+ln.Addr().String()+"/"), "timeout")
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the first failure came after %v", took)
	}
}

// A certificate the dispatcher does not trust is refused; with the
// endpoint's ca_file naming its CA it is delivered.
func TestHostileInvalidCertificate(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	hostileFailure(t, endpoint("tls", srv.URL), "tls")

	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	ep := endpoint("tls", srv.URL)
	ep.CAFile = ca
	e := newEnv(t, "eu")
	_, reg := e.dispatcher(config(t, ep))
	waitLanes(t, e, "tls", "eu")
	e.publish(e.transition("eu", "r", "u", presence.Online))
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("presence_webhook_deliveries_total{tls}, over the CA file", gauge(reg, "presence_webhook_deliveries_total", "tls"), 1)
	})
}

// Without allow_networks, a loopback endpoint is refused at dial time:
// the receiver never sees a connection, whether the URL names the
// address or a name that resolves to it.
func TestHostilePrivateAddressIsRefused(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	for _, u := range []string{srv.URL, "http://localhost:" + port + "/"} {
		ep := endpoint("private", u)
		ep.AllowNetworks = nil
		hostileFailure(t, ep, "forbidden_address")
	}
	if conns.Load() != 0 {
		t.Errorf("%d connections reached the receiver", conns.Load())
	}
}

// A certificate from a trusted CA but for another name is refused: the
// httptest certificate names 127.0.0.1 and example.com, not localhost.
func TestHostileCertificateForAnotherName(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	ep := endpoint("tls", strings.Replace(srv.URL, "127.0.0.1", "localhost", 1))
	ep.CAFile = ca
	hostileFailure(t, ep, "tls")
}
