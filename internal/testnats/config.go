package testnats

import (
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/presence-dev/presence/internal/testkit"
)

// Configured is a supercluster started from nats-server configuration
// files, one server per file.
type Configured struct {
	servers map[string]*server.Server // by cluster name
	log     *ServerLog
}

// Server returns the server of cluster name.
func (c *Configured) Server(name string) *server.Server {
	s := c.servers[name]
	if s == nil {
		panic("testnats: no cluster " + name)
	}
	return s
}

// Log returns what the servers logged.
func (c *Configured) Log() *ServerLog { return c.log }

// StartConfigured loads each file as nats-server would (variables from
// the environment included) and starts one server per file. Only
// addresses and storage are replaced: every listener binds 127.0.0.1 on
// a free port, each cluster's routes point at its own cluster port (as a
// one-server cluster's route to itself does), each gateway URL at that
// cluster's gateway listener, and JetStream stores in a temporary
// directory. Everything else (accounts, users, permissions, JetStream
// limits, cluster and gateway names) is the files' own. It waits until
// every gateway is connected and a JetStream meta leader knows every
// server, and stops the servers at cleanup.
func StartConfigured(tb testing.TB, files ...string) *Configured {
	tb.Helper()
	server.SetGatewaysSolicitDelay(gatewayDelay)
	var lastErr string
	for range 3 {
		c, err := startConfigured(tb, files)
		if err == "" {
			waitConfigured(tb, c, 30*time.Second)
			return c
		}
		lastErr = err
	}
	tb.Fatalf("nats-server from %v: %s", files, lastErr)
	return nil
}

func startConfigured(tb testing.TB, files []string) (*Configured, string) {
	opts, order := readConfigs(tb, files)
	gwPort := map[string]int{}
	for _, n := range order {
		gwPort[n] = pickPort(tb)
	}
	log := &ServerLog{}
	c := &Configured{servers: map[string]*server.Server{}, log: log}
	var started []*server.Server
	stop := func() {
		for _, s := range started {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}
	for _, n := range order {
		o := opts[n]
		o.Host, o.Port = "127.0.0.1", -1
		if o.HTTPPort != 0 {
			o.HTTPHost, o.HTTPPort = "127.0.0.1", -1 // monitoring, on a free port
		}
		o.NoSigs, o.NoLog = true, false
		o.StoreDir = tb.TempDir()
		port := pickPort(tb)
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", port
		if len(o.Routes) > 0 {
			o.Routes = server.RoutesFromStr(fmt.Sprintf("nats-route://127.0.0.1:%d", port))
		}
		o.Gateway.Host, o.Gateway.Port = "127.0.0.1", gwPort[n]
		for _, g := range o.Gateway.Gateways {
			p, ok := gwPort[g.Name]
			if !ok {
				tb.Fatalf("nats-server config of %s: gateway %q has no file", n, g.Name)
			}
			u, _ := url.Parse(fmt.Sprintf("nats://127.0.0.1:%d", p))
			g.URLs = []*url.URL{u}
		}
		s, err := server.NewServer(o)
		if err != nil {
			tb.Fatalf("nats-server %s: %v", n, err)
		}
		fatal := &fatalLog{ch: make(chan string, 1)}
		s.SetLogger(&teeLog{fatal: fatal, log: log, name: n}, false, false)
		go s.Start()
		if msg := waitReady(s, fatal.ch, 10*time.Second); msg != "" {
			s.Shutdown()
			s.WaitForShutdown()
			stop()
			return nil, msg
		}
		started = append(started, s)
		c.servers[n] = s
	}
	tb.Cleanup(stop)
	return c, ""
}

// readConfigs parses the config files, one cluster each, named alike as
// cluster and gateway; order is the files' order.
func readConfigs(tb testing.TB, files []string) (map[string]*server.Options, []string) {
	opts := map[string]*server.Options{}
	var order []string
	for _, f := range files {
		o, err := server.ProcessConfigFile(f)
		if err != nil {
			tb.Fatalf("nats-server config %s: %v", f, err)
		}
		if o.Gateway.Name == "" || o.Cluster.Name != o.Gateway.Name {
			tb.Fatalf("nats-server config %s: cluster %q and gateway %q must be named alike", f, o.Cluster.Name, o.Gateway.Name)
		}
		if _, dup := opts[o.Gateway.Name]; dup {
			tb.Fatalf("nats-server config %s: cluster %q twice", f, o.Gateway.Name)
		}
		opts[o.Gateway.Name] = o
		order = append(order, o.Gateway.Name)
	}
	return opts, order
}

// waitConfigured waits until every server has its gateways and every
// server sees a JetStream meta leader that knows every server.
func waitConfigured(tb testing.TB, c *Configured, timeout time.Duration) {
	tb.Helper()
	testkit.CheckFor(tb, timeout, 20*time.Millisecond, func() error {
		err := gatewaysUp(c.servers)
		if err == nil {
			err = metaUp(c.servers)
		}
		if err != nil {
			return fmt.Errorf("configured supercluster not ready: %w", err)
		}
		return nil
	})
}

func metaUp(servers map[string]*server.Server) error {
	for n, s := range servers {
		jsz, err := s.Jsz(nil)
		if err != nil {
			return err
		}
		if jsz.Meta == nil || jsz.Meta.Leader == "" || len(jsz.Meta.Replicas)+1 < len(servers) {
			return fmt.Errorf("%s: no JetStream meta leader that knows every server yet", n)
		}
	}
	return nil
}

func gatewaysUp(servers map[string]*server.Server) error {
	for n, s := range servers {
		gz, err := s.Gatewayz(nil)
		if err != nil {
			return err
		}
		for m := range servers {
			if m == n {
				continue
			}
			if o := gz.OutboundGateways[m]; o == nil || o.Connection == nil {
				return fmt.Errorf("%s has no outbound gateway to %s", n, m)
			}
			if len(gz.InboundGateways[m]) == 0 {
				return fmt.Errorf("%s has no inbound gateway from %s", n, m)
			}
		}
	}
	return nil
}

// ServerLog keeps the warnings and errors servers log, such as
// permission violations.
type ServerLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *ServerLog) add(line string) {
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
}

// Lines returns the lines logged so far that contain substr.
func (l *ServerLog) Lines(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.lines {
		if strings.Contains(s, substr) {
			out = append(out, s)
		}
	}
	return out
}

// teeLog hands fatal errors to fatal and keeps warnings and errors.
type teeLog struct {
	fatal *fatalLog
	log   *ServerLog
	name  string
}

func (l *teeLog) Fatalf(format string, v ...any) {
	l.fatal.Fatalf(format, v...)
	l.log.add(l.name + " [FTL] " + fmt.Sprintf(format, v...))
}
func (l *teeLog) Errorf(format string, v ...any) {
	l.log.add(l.name + " [ERR] " + fmt.Sprintf(format, v...))
}
func (l *teeLog) Warnf(format string, v ...any) {
	l.log.add(l.name + " [WRN] " + fmt.Sprintf(format, v...))
}
func (*teeLog) Noticef(string, ...any) {}
func (*teeLog) Debugf(string, ...any)  {}
func (*teeLog) Tracef(string, ...any)  {}
