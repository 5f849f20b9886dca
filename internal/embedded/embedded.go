// Package embedded runs the in-process nats-server presenced starts when
// no NATS URL is configured. It lives apart from package bus so that only
// the command links nats-server: bus, node and global are clients.
package embedded

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/presence-dev/presence/presence"
)

// Server defaults.
const (
	DefaultHost = "127.0.0.1"
	DefaultPort = 4222
)

// DefaultStoreDir is where an embedded server keeps JetStream data when
// Config.StoreDir is empty. Two servers must not share it.
func DefaultStoreDir() string { return filepath.Join(os.TempDir(), "presence-nats") }

// Config configures the in-process nats-server used when no NATS
// URL is configured. Zero fields take their defaults.
type Config struct {
	Host       string       // default 127.0.0.1
	Port       int          // default 4222; -1 picks a free port
	StoreDir   string       // JetStream storage; default DefaultStoreDir()
	ServerName string       // default: chosen by the server; required with a cluster
	Logger     *slog.Logger // the server's log goes here; nil logs nothing

	// Cluster, when set, clusters this server with the other servers of
	// its region (routes) and joins the region's cluster to the other
	// regions' (gateways): JetStream then runs clustered across the
	// supercluster.
	Cluster *Cluster
}

// Cluster clusters an embedded server. Its cluster and its gateway both
// take Name: nats-server places streams by cluster name, and a gateway
// must carry its cluster's name.
type Cluster struct {
	Name   string // the cluster (and gateway) name: the region
	Listen string // host:port for routes from the region's other servers
	// Routes lists every server of the region's cluster, this one
	// included: clustered JetStream needs configured routes, and a
	// server recognises and drops the route to itself.
	Routes []string // nats-route://host:port
	// GatewayListen, when set, accepts gateways of the other regions;
	// Gateways lists where each region's cluster accepts them (this
	// region's own entry may be there too).
	GatewayListen string
	Gateways      []Gateway
}

// Gateway is one region's cluster as the gateways reach it.
type Gateway struct {
	Name string
	URLs []string // nats://host:port
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.StoreDir == "" {
		c.StoreDir = DefaultStoreDir()
	}
	return c
}

// Validate checks c as given: call WithDefaults first to fill zero fields.
func (c Config) Validate() error {
	if c.Host == "" {
		return &presence.ConfigError{Field: "host", Rule: "must not be empty"}
	}
	if c.Port < -1 || c.Port == 0 || c.Port > 65535 {
		return &presence.ConfigError{Field: "port", Rule: fmt.Sprintf("must be -1 (any free port) or 1 to 65535, got %d", c.Port)}
	}
	if c.StoreDir == "" {
		return &presence.ConfigError{Field: "store dir", Rule: "must not be empty"}
	}
	if c.Cluster != nil {
		return c.Cluster.validate(c.ServerName)
	}
	return nil
}

func (c *Cluster) validate(serverName string) error {
	switch {
	case c.Name == "":
		return &presence.ConfigError{Field: "cluster name", Rule: "must not be empty"}
	case serverName == "":
		// JetStream's meta group tells its peers apart by name.
		return &presence.ConfigError{Field: "server name", Rule: "is required in a cluster, unique in the supercluster"}
	case c.Listen == "":
		// Gateways without routes would leave JetStream unclustered.
		return &presence.ConfigError{Field: "cluster listen", Rule: "is required in a cluster (host:port)"}
	case len(c.Routes) == 0:
		return &presence.ConfigError{Field: "routes", Rule: "must list every server of the cluster, this one included"}
	case len(c.Gateways) > 0 && c.GatewayListen == "":
		return &presence.ConfigError{Field: "gateway listen", Rule: "is required with gateways (host:port)"}
	}
	if _, err := hostPort(c.Listen); err != nil {
		return &presence.ConfigError{Field: "cluster listen", Rule: err.Error()}
	}
	if c.GatewayListen != "" {
		if _, err := hostPort(c.GatewayListen); err != nil {
			return &presence.ConfigError{Field: "gateway listen", Rule: err.Error()}
		}
	}
	if _, err := parseURLs(c.Routes); err != nil {
		return &presence.ConfigError{Field: "routes", Rule: err.Error()}
	}
	for _, g := range c.Gateways {
		if g.Name == "" {
			return &presence.ConfigError{Field: "gateways", Rule: "every gateway needs a name"}
		}
		if _, err := parseURLs(g.URLs); err != nil {
			return &presence.ConfigError{Field: "gateways", Rule: g.Name + ": " + err.Error()}
		}
	}
	return nil
}

type listenAddr struct {
	host string
	port int
}

// hostPort splits a listen address; an empty host listens on every
// interface, as nats-server's own configuration does.
func hostPort(addr string) (listenAddr, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return listenAddr{}, fmt.Errorf("%q: want host:port", addr)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return listenAddr{}, fmt.Errorf("%q: want a port from 1 to 65535", addr)
	}
	if h == "" {
		h = "0.0.0.0"
	}
	return listenAddr{h, port}, nil
}

func parseURLs(us []string) ([]*url.URL, error) {
	out := make([]*url.URL, 0, len(us))
	for _, s := range us {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("%q: want scheme://host:port", s)
		}
		out = append(out, u)
	}
	return out, nil
}

// apply sets the cluster and gateway options; c is valid.
func (c *Cluster) apply(o *server.Options) {
	l, _ := hostPort(c.Listen)
	o.Cluster = server.ClusterOpts{Name: c.Name, Host: l.host, Port: l.port}
	o.Routes, _ = parseURLs(c.Routes)
	if c.GatewayListen == "" {
		return
	}
	g, _ := hostPort(c.GatewayListen)
	o.Gateway = server.GatewayOpts{Name: c.Name, Host: g.host, Port: g.port}
	for _, gw := range c.Gateways {
		us, _ := parseURLs(gw.URLs)
		o.Gateway.Gateways = append(o.Gateway.Gateways, &server.RemoteGatewayOpts{Name: gw.Name, URLs: us})
	}
}

// LocalURL is the URL a client in this process connects to s with: its
// client URL, with a wildcard listen host (0.0.0.0, ::) made loopback.
func LocalURL(s *server.Server) string {
	u, err := url.Parse(s.ClientURL())
	if err != nil {
		return s.ClientURL()
	}
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
		u.Host = net.JoinHostPort("127.0.0.1", u.Port())
	}
	return u.String()
}

// Start starts an in-process nats-server with JetStream and
// returns once it accepts clients. The caller owns it: Shutdown, then
// WaitForShutdown. Connect with s.ClientURL().
func Start(cfg Config) (*server.Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StoreDir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded: store dir: %w", err)
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true, // signals belong to the host process
		NoLog:      cfg.Logger == nil,
	}
	// Clustered, the server's own traffic (JetStream's meta layer, gateway
	// interest) runs in the system account nats-server creates by default
	// ($SYS) when no accounts are configured.
	if cfg.Cluster != nil {
		cfg.Cluster.apply(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	// The server reports a listener it cannot open (a port in use) as a
	// fatal log line and keeps waiting; the adapter turns it into an
	// error at once, whether or not the caller wants the log.
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	ad := slogAdapter{l: lg, fatal: make(chan string, 1)}
	s.SetLogger(ad, false, false)
	go s.Start()
	if err := waitReady(s, ad.fatal, 10*time.Second); err != nil {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("embedded: nats-server on %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	if !s.JetStreamEnabled() {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("embedded: JetStream did not start (store dir %s)", cfg.StoreDir)
	}
	return s, nil
}

// waitReady returns once s accepts clients, or at the server's first
// fatal error, or after d.
func waitReady(s *server.Server, fatal <-chan string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for !s.ReadyForConnections(50 * time.Millisecond) {
		select {
		case msg := <-fatal:
			return fmt.Errorf("%s", msg)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready in %v", d)
		}
	}
	return nil
}

// slogAdapter writes the server's log to a slog.Logger. Fatal is logged
// as an error and its first message passed on to fatal: the host process
// decides whether to exit.
type slogAdapter struct {
	l     *slog.Logger
	fatal chan string
}

func (a slogAdapter) log(level slog.Level, format string, v []any) {
	if ctx := context.Background(); a.l.Enabled(ctx, level) {
		a.l.Log(ctx, level, fmt.Sprintf(format, v...), "component", "nats-server")
	}
}

func (a slogAdapter) Noticef(format string, v ...any) { a.log(slog.LevelInfo, format, v) }
func (a slogAdapter) Warnf(format string, v ...any)   { a.log(slog.LevelWarn, format, v) }
func (a slogAdapter) Fatalf(format string, v ...any) {
	a.log(slog.LevelError, format, v)
	select {
	case a.fatal <- fmt.Sprintf(format, v...):
	default:
	}
}
func (a slogAdapter) Errorf(format string, v ...any) { a.log(slog.LevelError, format, v) }
func (a slogAdapter) Debugf(format string, v ...any) { a.log(slog.LevelDebug, format, v) }
func (a slogAdapter) Tracef(format string, v ...any) { a.log(slog.LevelDebug, format, v) }
