package node

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
)

// A flood of idle keep-alive HTTP connections (one health check each,
// then nothing) cannot fill the node: past MaxHTTPConns the longest idle
// are closed, and a client still connects and joins.
func TestIdleConnectionsCannotLockClientsOut(t *testing.T) {
	e := newEnv(t)
	const max = 20
	n := e.newNode(func(c *Config) { c.Limits.MaxHTTPConns = max })
	addr := strings.TrimPrefix(n.srv.URL, "http://")
	var flood []net.Conn
	for range 10 * max {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write([]byte("GET " + PathHealth + " HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		flood = append(flood, c) // kept open, idle
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if o := n.guard.open(); o > max {
			return fmt.Errorf("%d plain connections open, want at most %d", o, max)
		}
		return nil
	})
	c := n.dial(t, token(t, "real", []string{"*"}, time.Hour), "s")
	c.join("r")
	// The oldest idle ones were closed by the node.
	closed := 0
	for _, f := range flood[:max] {
		_ = f.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := f.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			closed++
		}
	}
	if closed != max {
		t.Fatalf("%d of the %d oldest idle connections closed, want all", closed, max)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
