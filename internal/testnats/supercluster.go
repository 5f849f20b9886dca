package testnats

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/internal/testkit"
)

// gatewayDelay replaces the server's 1s wait before soliciting gateways.
const gatewayDelay = 10 * time.Millisecond

// SuperCluster is a NATS supercluster for tests: one single-server cluster
// per name, each cluster's Cluster.Name equal to its Gateway.Name, joined
// by gateways, with the default system account and one JetStream system
// spanning all of them (place a stream in a cluster with
// jetstream.Placement{Cluster: name}).
//
// Every gateway connection into a cluster runs through a TCP proxy owned
// by the test, and each cluster advertises its proxy, so gateway gossip
// never bypasses it. Isolate and Heal cut and restore all of a cluster's
// gateway links, as a WAN partition would.
type SuperCluster struct {
	names   []string
	servers map[string]*server.Server
	proxies map[string]*gwProxy // in front of each cluster's gateway listener
}

// StartSuperCluster starts one cluster per name (at least two), joins
// them and waits until every gateway is connected and JetStream answers
// on every server. Everything stops at cleanup.
func StartSuperCluster(tb testing.TB, names ...string) *SuperCluster {
	tb.Helper()
	if len(names) < 2 {
		tb.Fatalf("a supercluster needs at least two clusters, got %v", names)
	}
	server.SetGatewaysSolicitDelay(gatewayDelay)
	sc := &SuperCluster{names: names, servers: map[string]*server.Server{}, proxies: map[string]*gwProxy{}}
	for _, n := range names {
		if _, dup := sc.proxies[n]; dup {
			tb.Fatalf("cluster %q named twice", n)
		}
		p, err := newGWProxy()
		if err != nil {
			tb.Fatalf("gateway proxy for %s: %v", n, err)
		}
		tb.Cleanup(p.close)
		sc.proxies[n] = p
	}
	for _, n := range names {
		var remotes []*server.RemoteGatewayOpts
		for _, m := range names {
			if m != n {
				u, _ := url.Parse("nats://" + sc.proxies[m].addr())
				remotes = append(remotes, &server.RemoteGatewayOpts{Name: m, URLs: []*url.URL{u}})
			}
		}
		s := startGatewayServer(tb, n, sc.proxies[n].addr(), remotes)
		sc.proxies[n].setTarget(s.GatewayAddr().String())
		sc.servers[n] = s
	}
	sc.WaitConnected(tb, 20*time.Second)
	sc.WaitJetStream(tb, 20*time.Second)
	return sc
}

// Names returns the cluster names in the order given.
func (sc *SuperCluster) Names() []string { return append([]string(nil), sc.names...) }

// Server returns the server of cluster name.
func (sc *SuperCluster) Server(name string) *server.Server {
	s := sc.servers[name]
	if s == nil {
		panic("testnats: no cluster " + name)
	}
	return s
}

// Connect returns a client connection to cluster name's server, closed at
// cleanup. It reconnects for ever, so it survives the server's partition.
func (sc *SuperCluster) Connect(tb testing.TB, name string) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(sc.Server(name).ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		tb.Fatalf("connect %s: %v", name, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// connected reports whether every server has an outbound and an inbound
// gateway connection to every other cluster.
func (sc *SuperCluster) connected(among []string) error {
	for _, n := range among {
		gz, err := sc.servers[n].Gatewayz(nil)
		if err != nil {
			return err
		}
		for _, m := range among {
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

// WaitConnected waits until every cluster's gateways to every other
// cluster are up (after Heal, too).
func (sc *SuperCluster) WaitConnected(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	testkit.CheckFor(tb, timeout, 20*time.Millisecond, func() error {
		if err := sc.connected(sc.names); err != nil {
			return fmt.Errorf("supercluster not connected: %w", err)
		}
		return nil
	})
}

// WaitJetStream waits until JetStream answers on every server and the
// meta leader can place a stream in every cluster (it learns the other
// clusters' servers a moment after electing itself).
func (sc *SuperCluster) WaitJetStream(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for _, n := range sc.names {
		nc, err := nats.Connect(sc.servers[n].ClientURL())
		if err != nil {
			tb.Fatalf("connect %s: %v", n, err)
		}
		js, _ := jetstream.New(nc)
		err = testkit.Poll(time.Until(deadline), 50*time.Millisecond, func() error { return probeJetStream(js, n) })
		if err != nil {
			nc.Close()
			tb.Fatalf("JetStream cannot place a stream in %s: %v", n, err)
		}
		nc.Close()
	}
}

// probeJetStream creates and deletes a stream placed in cluster.
func probeJetStream(js jetstream.JetStream, cluster string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	name := "TESTNATS_PROBE_" + cluster
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{"testnats-probe." + cluster},
		Storage: jetstream.MemoryStorage, Placement: &jetstream.Placement{Cluster: cluster},
	})
	if err != nil {
		return err
	}
	return js.DeleteStream(ctx, name)
}

// Isolate cuts every gateway link of cluster name, both ways, and refuses
// new ones until Heal. Clients of its server stay connected to it.
func (sc *SuperCluster) Isolate(name string) {
	sc.Server(name)
	for n, p := range sc.proxies {
		if n == name {
			p.setDown(true)
		} else {
			p.setCut(name, true)
		}
	}
}

// Heal restores cluster name's gateway links; the servers reconnect on
// their own (about a second). Use WaitConnected to wait for it.
func (sc *SuperCluster) Heal(name string) {
	sc.Server(name)
	for n, p := range sc.proxies {
		if n == name {
			p.setDown(false)
		} else {
			p.setCut(name, false)
		}
	}
}

// GatewayBytes returns the bytes every server has sent on its current
// gateway connections, summed: each byte that crossed a gateway counts
// once. Counters of closed connections are lost, so compare two readings
// only across a period without partitions.
func (sc *SuperCluster) GatewayBytes() (uint64, error) {
	var total uint64
	for _, n := range sc.names {
		gz, err := sc.servers[n].Gatewayz(nil)
		if err != nil {
			return 0, err
		}
		for _, o := range gz.OutboundGateways {
			if o.Connection != nil {
				total += uint64(o.Connection.OutBytes)
			}
		}
		for _, in := range gz.InboundGateways {
			for _, c := range in {
				if c.Connection != nil {
					total += uint64(c.Connection.OutBytes)
				}
			}
		}
	}
	return total, nil
}

// startGatewayServer starts cluster n's only server. Its route port is
// picked before the server binds it, so another process may take it in
// between; the server then reports the failed listen through its logger
// and the start is retried on a fresh port.
func startGatewayServer(tb testing.TB, n, advertise string, remotes []*server.RemoteGatewayOpts) *server.Server {
	tb.Helper()
	var lastErr string
	for range 5 {
		o := Options(tb)
		o.ServerName = n
		// Clustered JetStream insists on configured routes; a route to
		// itself satisfies it (the server detects and drops it), so each
		// cluster can be a single server.
		port := pickPort(tb)
		o.Cluster = server.ClusterOpts{Name: n, Host: "127.0.0.1", Port: port}
		o.Routes = server.RoutesFromStr(fmt.Sprintf("nats-route://127.0.0.1:%d", port))
		o.Gateway = server.GatewayOpts{
			Name: n, Host: "127.0.0.1", Port: -1,
			Advertise: advertise, // gossip names the proxy, never the listener
			Gateways:  remotes,
		}
		s, err := server.NewServer(o)
		if err != nil {
			tb.Fatalf("nats-server %s: %v", n, err)
		}
		fatal := &fatalLog{ch: make(chan string, 1)}
		s.SetLogger(fatal, false, false)
		go s.Start()
		if lastErr = waitReady(s, fatal.ch, readyTimeout); lastErr == "" {
			tb.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
			return s
		}
		s.Shutdown()
		s.WaitForShutdown()
		retried(n, lastErr)
	}
	tb.Fatalf("nats-server %s: %s", n, lastErr)
	return nil
}

// readyTimeout bounds the wait for a server that neither accepts
// connections nor reports a fatal error.
const readyTimeout = 10 * time.Second

// notReady is waitReady's answer when the timeout passed.
const notReady = "not ready in "

// waitReady waits until s accepts connections and returns "", or returns
// why it will not: a fatal error it logged or the timeout.
func waitReady(s *server.Server, fatal <-chan string, timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for !s.ReadyForConnections(20 * time.Millisecond) {
		select {
		case msg := <-fatal:
			return msg
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf(notReady+"%v", timeout)
		}
	}
	return ""
}

// fatalLog is a server.Logger that drops everything but the first fatal
// error, which it hands over on ch.
type fatalLog struct{ ch chan string }

func (l *fatalLog) Fatalf(format string, v ...any) {
	select {
	case l.ch <- fmt.Sprintf(format, v...):
	default:
	}
}
func (*fatalLog) Noticef(string, ...any) {}
func (*fatalLog) Warnf(string, ...any)   {}
func (*fatalLog) Errorf(string, ...any)  {}
func (*fatalLog) Debugf(string, ...any)  {}
func (*fatalLog) Tracef(string, ...any)  {}

// pickPort is freePort; a test replaces it to force a taken port.
var pickPort = freePort

// retried is told why each failed start of a cluster's server is retried;
// a test replaces it to see the cause.
var retried = func(cluster, why string) {}

// freePort returns a port that was free a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// WireBytes returns every byte the gateway proxies have forwarded, both
// ways, since the start: what crossed the "WAN", protocol lines, pings
// and interest updates included. GatewayBytes, from the servers'
// statistics, counts message payloads only.
func (sc *SuperCluster) WireBytes() uint64 {
	var total uint64
	for _, p := range sc.proxies {
		total += p.bytes.Load()
	}
	return total
}

// gwProxy forwards gateway connections to one cluster's listener. It
// learns each connection's origin cluster from the gateway CONNECT the
// soliciting server sends first, so it can cut one origin's links.
type gwProxy struct {
	ln net.Listener

	mu     sync.Mutex
	target string
	down   bool            // the destination is isolated: refuse everything
	cut    map[string]bool // origins refused
	conns  map[*proxied]struct{}
	closed bool
	wg     sync.WaitGroup
	bytes  atomic.Uint64 // forwarded, both ways
}

type proxied struct {
	origin       string // "" until the CONNECT is read
	client, serv net.Conn
}

func (c *proxied) close() {
	_ = c.client.Close()
	_ = c.serv.Close()
}

func newGWProxy() (*gwProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &gwProxy{ln: ln, cut: map[string]bool{}, conns: map[*proxied]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *gwProxy) addr() string { return p.ln.Addr().String() }

func (p *gwProxy) setTarget(t string) {
	p.mu.Lock()
	p.target = t
	p.mu.Unlock()
}

func (p *gwProxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	var drop []*proxied
	if down {
		for c := range p.conns {
			drop = append(drop, c)
		}
	}
	p.mu.Unlock()
	for _, c := range drop {
		c.close()
	}
}

func (p *gwProxy) setCut(origin string, cut bool) {
	p.mu.Lock()
	p.cut[origin] = cut
	var drop []*proxied
	if cut {
		for c := range p.conns {
			if c.origin == origin {
				drop = append(drop, c)
			}
		}
	}
	p.mu.Unlock()
	for _, c := range drop {
		c.close()
	}
}

func (p *gwProxy) close() {
	p.mu.Lock()
	p.closed = true
	var drop []*proxied
	for c := range p.conns {
		drop = append(drop, c)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range drop {
		c.close()
	}
	p.wg.Wait()
}

func (p *gwProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c)
	}
}

// allowed registers a new connection unless the destination is down. Its
// origin is checked once its CONNECT is read.
func (p *gwProxy) allowed(c *proxied) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.down {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *gwProxy) forget(c *proxied) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *gwProxy) serve(client net.Conn) {
	defer p.wg.Done()
	// Servers start one after the other: an early dial waits for its
	// destination rather than failing into the server's 1s retry delay.
	var target string
	err := testkit.Poll(10*time.Second, 5*time.Millisecond, func() error {
		p.mu.Lock()
		target = p.target
		p.mu.Unlock()
		if target == "" {
			return errors.New("no target yet")
		}
		return nil
	})
	if err != nil {
		_ = client.Close()
		return
	}
	serv, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	c := &proxied{client: client, serv: serv}
	if !p.allowed(c) {
		c.close()
		return
	}
	defer p.forget(c)
	// The accepting server speaks first (INFO); the soliciting one answers
	// with CONNECT, which names its cluster.
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(counting{client, &p.bytes}, serv)
		c.close()
		close(done)
	}()
	br := bufio.NewReader(client)
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := br.ReadString('\n')
	_ = client.SetReadDeadline(time.Time{})
	if err == nil {
		origin := gatewayOrigin(line)
		p.mu.Lock()
		c.origin = origin
		refused := p.down || p.cut[origin]
		p.mu.Unlock()
		if !refused {
			if _, err = io.WriteString(counting{serv, &p.bytes}, line); err == nil {
				_, _ = io.Copy(counting{serv, &p.bytes}, br)
			}
		}
	}
	c.close()
	<-done
}

// counting is a writer that adds what it writes to n.
type counting struct {
	w io.Writer
	n *atomic.Uint64
}

// Write implements io.Writer.
func (c counting) Write(b []byte) (int, error) {
	k, err := c.w.Write(b)
	c.n.Add(uint64(k))
	return k, err
}

// gatewayOrigin returns the "gateway" field of a CONNECT line, or "".
func gatewayOrigin(line string) string {
	rest, ok := strings.CutPrefix(line, "CONNECT ")
	if !ok {
		return ""
	}
	var ci struct {
		Gateway string `json:"gateway"`
	}
	if json.Unmarshal([]byte(strings.TrimSpace(rest)), &ci) != nil {
		return ""
	}
	return ci.Gateway
}
