// Package testredis starts real redis-server processes for tests: a single
// server or a small Redis Cluster, each in its own temporary directory and
// stopped by t.Cleanup. A missing redis-server fails the test with the
// command that installs it; nothing is skipped.
package testredis

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
)

const installHint = "redis-server not found in PATH; install it with: apt-get install -y redis-server"

// Server is a running redis-server.
type Server struct {
	Addr string
	cmd  *exec.Cmd
	args []string
}

// Stop kills the server at once, as a crash would.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// RestartEmpty kills the server and starts a new one on the same address
// with no data, as a Redis without persistence (or a failover to a
// replica that lost writes) comes back.
func (s *Server) RestartEmpty(tb testing.TB) {
	tb.Helper()
	s.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		cmd := exec.Command(s.cmd.Path, s.args...)
		if err := cmd.Start(); err != nil {
			tb.Fatalf("restart redis-server: %v", err)
		}
		s.cmd = cmd
		err := waitReady(s.Addr, cmd.Process.Pid)
		if err == nil {
			return
		}
		s.Stop()
		if time.Now().After(deadline) {
			tb.Fatalf("redis-server did not come back on %s: %v", s.Addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pause stops the server (SIGSTOP) as a stalled or failing-over Redis
// would: connections stay open, commands queue, nothing answers.
func (s *Server) Pause() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT); queued commands run then.
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// start starts a redis-server; extra, when set, adds arguments for each
// attempt (an attempt on a taken port is retried with fresh ports).
func start(tb testing.TB, extra func() []string) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatal(installHint)
	}
	var lastErr error
	for range 5 {
		dir := tb.TempDir()
		port := freePort(tb)
		args := []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning",
		}
		if extra != nil {
			args = append(args, extra()...)
		}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = nil, nil
		if err := cmd.Start(); err != nil {
			tb.Fatalf("start redis-server: %v", err)
		}
		s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd, args: args}
		if lastErr = waitReady(s.Addr, cmd.Process.Pid); lastErr == nil {
			tb.Cleanup(func() { s.Resume(); s.Stop() })
			return s
		}
		s.Stop() // the port was taken under us; try another
	}
	tb.Fatalf("redis-server did not start: %v", lastErr)
	return nil
}

// waitReady waits until the redis-server with process id pid answers on
// addr. The pid check matters: when the port was taken under us, another
// test's server may be the one answering there.
func waitReady(addr string, pid int) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		info, err := c.InfoMap(ctx, "server").Result()
		cancel()
		if err == nil {
			if got := info["Server"]["process_id"]; got != strconv.Itoa(pid) {
				return fmt.Errorf("%s is served by process %s, not %d", addr, got, pid)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Start starts a standalone redis-server.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return start(tb, nil)
}

// Client starts a standalone redis-server and returns a client for it,
// closed at cleanup.
func Client(tb testing.TB) (*redis.Client, *Server) {
	tb.Helper()
	s := Start(tb)
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c, s
}

// Cluster starts n masters with no replicas, joins them into a Redis
// Cluster covering all slots and returns a client for it.
func Cluster(tb testing.TB, n int) (*redis.ClusterClient, []*Server) {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		tb.Fatal(installHint)
	}
	servers := make([]*Server, n)
	addrs := make([]string, n)
	for i := range servers {
		// The bus port is picked too: the default, port + 10000, is
		// beyond 65535 for a third of the ephemeral range.
		servers[i] = start(tb, func() []string {
			// nodes.conf lands in the attempt's own --dir.
			return []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "2000", "--cluster-port", strconv.Itoa(freePort(tb))}
		})
		addrs[i] = servers[i].Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// One deadline for the whole cluster: every master agrees, then the
	// client sees every slot assigned before tests run.
	deadline := time.Now().Add(10 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		testkit.CheckFor(tb, time.Until(deadline), 50*time.Millisecond, func() error {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && !clusterOK(info) {
				err = fmt.Errorf("not ok: %s", info)
			}
			if err != nil {
				return fmt.Errorf("cluster at %s: %w", a, err)
			}
			return nil
		})
		_ = c.Close()
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	tb.Cleanup(func() { _ = cc.Close() })
	testkit.CheckFor(tb, time.Until(deadline), 50*time.Millisecond, func() error {
		err := cc.ForEachShard(context.Background(), func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
		if err != nil {
			return fmt.Errorf("cluster client: %w", err)
		}
		return nil
	})
	return cc, servers
}

func clusterOK(info string) bool {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "cluster_state:ok" {
			return true
		}
	}
	return false
}
