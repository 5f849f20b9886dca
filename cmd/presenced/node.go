package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/internal/embedded"
	"github.com/presence-dev/presence/node"
	"github.com/presence-dev/presence/presence"
)

// commonFlags registers the flags node and dev share.
type commonFlags struct {
	region, redis, nats, natsStoreDir, listen string
	natsPort                                  int
	redisCluster, insecureDev, compression    bool
	redisPrefix                               string
	timing                                    presence.Timing
	maxConns, maxRooms                        int
	maxWatchUsers, batchFrom, fanoutBudget    int
	maxInflight                               int
	joinRate, joinRateMin                     float64
	joinLatency, maxRetryAfter                time.Duration
	fanoutTick                                time.Duration
	streamMaxAge, drainTimeout                time.Duration
	logLevel, logFormat                       string
	pprofListen                               string
	tlsCert, tlsKey                           string
	natsCreds, natsCA                         string
	natsHost, natsServerName                  string
	natsClusterListen, natsRoutes             string
	natsGatewayListen, natsGateways           string
	global                                    bool
	globalCadence                             time.Duration
	api                                       apiFlags
}

func (c *commonFlags) register(fs *flag.FlagSet, listen string) {
	fs.StringVar(&c.region, "region", "local", "this region's name (letters, digits, - _ = @ + ~)")
	fs.StringVar(&c.redis, "redis", "redis://127.0.0.1:6379", "regional Redis: a redis:// URL or host:port[,host:port...] (several: Redis Cluster)")
	fs.BoolVar(&c.redisCluster, "redis-cluster", false, "treat --redis as a Redis Cluster even with one address")
	fs.StringVar(&c.redisPrefix, "redis-prefix", "presence", "prefix of the region's Redis keys (a new one starts the region on an empty keyspace: region/doc.go, Upgrading)")
	fs.StringVar(&c.nats, "nats", "", "NATS server URL; empty runs an embedded nats-server")
	fs.StringVar(&c.natsCreds, "nats-creds", "", "NATS .creds file (user JWT and seed), for a secured NATS")
	fs.StringVar(&c.natsCA, "nats-ca", "", "PEM CA of the NATS servers' certificates (tls:// URLs)")
	fs.IntVar(&c.natsPort, "nats-port", 4222, "embedded nats-server port (-1: any free port)")
	fs.StringVar(&c.natsStoreDir, "nats-store-dir", "", "embedded nats-server JetStream directory, one per server (default: under the temp dir)")
	fs.StringVar(&c.natsHost, "nats-host", embedded.DefaultHost, "embedded nats-server client listen host (0.0.0.0: reachable by aggregators and other hosts)")
	fs.StringVar(&c.natsServerName, "nats-server-name", "", "embedded nats-server name: unique in the supercluster, stable across restarts (required with --nats-cluster-listen)")
	fs.StringVar(&c.natsClusterListen, "nats-cluster-listen", "", "embedded nats-server: cluster with the region's other nodes, routes accepted on host:port (e.g. 0.0.0.0:6222); the cluster is named after --region")
	fs.StringVar(&c.natsRoutes, "nats-routes", "", "embedded nats-server: comma-separated nats-route://host:port of every server of the region's cluster, this one included")
	fs.StringVar(&c.natsGatewayListen, "nats-gateway-listen", "", "embedded nats-server: accept other regions' gateways on host:port (e.g. 0.0.0.0:7222); the gateway is named after --region")
	fs.StringVar(&c.natsGateways, "nats-gateways", "", "embedded nats-server: comma-separated region=nats://host:port of the regions' gateways (a region may repeat, one URL each)")
	fs.StringVar(&c.listen, "listen", listen, "HTTP/WebSocket listen address")
	fs.DurationVar(&c.timing.SessionTTL, "session-ttl", presence.DefaultSessionTTL, "a session not refreshed this long is gone")
	fs.DurationVar(&c.timing.Heartbeat, "heartbeat", presence.DefaultHeartbeat, "how often the node refreshes its sessions")
	fs.DurationVar(&c.timing.OfflineGrace, "offline-grace", presence.DefaultOfflineGrace, "wait after a clean close before announcing offline")
	fs.DurationVar(&c.timing.ReapInterval, "reap-interval", presence.DefaultReapInterval, "how often the reaper looks for due rooms")
	fs.DurationVar(&c.timing.LastSeenInterval, "last-seen-interval", presence.DefaultLastSeenInterval, "at most one last-seen write per user this often")
	fs.Usage = groupedUsage(fs, commandIntro[fs.Name()], timingRules)
	fs.IntVar(&c.maxConns, "max-connections", node.DefaultMaxConnections, "connections per node (keep under the open-files limit)")
	fs.IntVar(&c.maxRooms, "max-rooms", node.DefaultMaxRooms, "rooms per connection (and watched rooms)")
	fs.IntVar(&c.maxWatchUsers, "max-watch-users", node.DefaultMaxWatchUsers, "users of one watch list")
	fs.DurationVar(&c.fanoutTick, "fanout-tick", node.DefaultFanoutTick, "how often batched events and counts go out")
	fs.IntVar(&c.maxInflight, "max-inflight", node.DefaultMaxInflight, "client requests waiting on the store at once; past it a node answers unavailable with a retry hint")
	fs.Float64Var(&c.joinRate, "join-rate", node.DefaultJoinRate, "joins/s that claim a session, at most, on this node (a reconnect storm): past it a join is refused with unavailable and a retry hint spread over the backlog, and the client's session is kept while it retries (negative: no bound)")
	fs.Float64Var(&c.joinRateMin, "join-rate-min", 0, "the least the join rate is cut to when the store slows down (0: min(100, --join-rate))")
	fs.DurationVar(&c.joinLatency, "join-latency", node.DefaultJoinLatency, "an admitted join whose claim takes longer than this cuts the join rate by 30 %")
	fs.DurationVar(&c.maxRetryAfter, "max-retry-after", 0, "the longest retry hint sent (0: min(20s, (session TTL - heartbeat)/2))")
	fs.IntVar(&c.fanoutBudget, "fanout-budget", node.DefaultFanoutBudget, "most frames per second the tick sends over all rooms: busy big rooms go out less often, each frame carrying more (negative: no bound)")
	fs.BoolVar(&c.compression, "compression", true, "permessage-deflate for clients that offer it: a big room's shared events frames go out compressed, once for every member")
	fs.IntVar(&c.batchFrom, "batch-from", node.DefaultBatchFrom, "local members from which a room's events go out batched, once per tick, to clients that take them (negative: never)")
	fs.DurationVar(&c.streamMaxAge, "stream-max-age", 24*time.Hour, "how long the transition stream keeps events")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 10*time.Second, "how long a graceful stop waits for clients to close")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "text or json")
	fs.StringVar(&c.pprofListen, "pprof-listen", "", "serve /debug/pprof on this address (e.g. 127.0.0.1:6060); off when empty")
	fs.StringVar(&c.tlsCert, "tls-cert-file", "", "PEM certificate (chain): serve HTTPS and WSS instead of HTTP and WS")
	fs.StringVar(&c.tlsKey, "tls-key-file", "", "PEM private key of --tls-cert-file")
	fs.BoolVar(&c.global, "global", false, "this region is one of several: publish it to the aggregators and show clients the global view")
	fs.DurationVar(&c.globalCadence, "global-cadence", global.DefaultCadence, "how often the region publishes to the aggregators (with --global)")
	c.api.register(fs)
}

// timingRules closes the --help of commands that take the timing flags:
// presence.TimingRules, which Validate checks.
var timingRules = func() string {
	var b strings.Builder
	b.WriteString("\nThe timing must keep these rules (the error names the one broken):\n")
	for _, r := range presence.TimingRules {
		fmt.Fprintf(&b, "  %-50s %s\n", r.Rule, r.Why)
	}
	return b.String()
}()

// embeddedCluster is the embedded nats-server's cluster from the
// --nats-cluster-* and --nats-gateway* flags, nil when none is set. The
// cluster and gateway take the region's name: streams are placed by
// cluster name, and a gateway must carry its cluster's.
func (c *commonFlags) embeddedCluster() (*embedded.Cluster, error) {
	if c.natsClusterListen == "" && c.natsRoutes == "" && c.natsGatewayListen == "" && c.natsGateways == "" {
		return nil, nil
	}
	if c.nats != "" {
		return nil, &usageError{"--nats-cluster-listen, --nats-routes, --nats-gateway-listen and --nats-gateways configure the embedded nats-server: not with --nats"}
	}
	cl := &embedded.Cluster{Name: c.region, Listen: c.natsClusterListen, GatewayListen: c.natsGatewayListen}
	if c.natsRoutes != "" {
		cl.Routes = strings.Split(c.natsRoutes, ",")
	}
	if c.natsGateways != "" {
		at := map[string]int{}
		for _, g := range strings.Split(c.natsGateways, ",") {
			name, u, ok := strings.Cut(g, "=")
			if !ok || name == "" {
				return nil, &usageError{fmt.Sprintf("--nats-gateways: %q: want region=nats://host:port", g)}
			}
			i, seen := at[name]
			if !seen {
				i = len(cl.Gateways)
				at[name] = i
				cl.Gateways = append(cl.Gateways, embedded.Gateway{Name: name})
			}
			cl.Gateways[i].URLs = append(cl.Gateways[i].URLs, u)
		}
	}
	ec := embedded.Config{Host: c.natsHost, Port: c.natsPort, StoreDir: c.natsStoreDir, ServerName: c.natsServerName, Cluster: cl}
	if err := ec.WithDefaults().Validate(); err != nil {
		return nil, &usageError{"embedded nats-server: " + err.Error()}
	}
	return cl, nil
}

func (c *commonFlags) config(stderr io.Writer) (serverConfig, error) {
	lg, err := newLogger(stderr, c.logLevel, c.logFormat)
	if err != nil {
		return serverConfig{}, err
	}
	cluster, err := c.embeddedCluster()
	if err != nil {
		return serverConfig{}, err
	}
	return serverConfig{
		NATSHost: c.natsHost, NATSServerName: c.natsServerName, NATSCluster: cluster,
		Region: c.region, Redis: c.redis, RedisCluster: c.redisCluster, RedisPrefix: c.redisPrefix,
		NATS: c.nats, NATSPort: c.natsPort, NATSStoreDir: c.natsStoreDir, Listen: c.listen,
		Timing: c.timing,
		Limits: node.Limits{MaxConnections: c.maxConns, MaxRooms: c.maxRooms, MaxWatches: c.maxRooms, MaxWatchUsers: c.maxWatchUsers, MaxInflight: c.maxInflight,
			JoinRate: c.joinRate, JoinRateMin: c.joinRateMin, JoinLatency: c.joinLatency, MaxRetryAfter: c.maxRetryAfter},
		FanoutTick: c.fanoutTick, BatchFrom: c.batchFrom, FanoutBudget: c.fanoutBudget, NoCompression: !c.compression,
		Auth:         node.AuthConfig{InsecureDev: c.insecureDev},
		StreamMaxAge: c.streamMaxAge, DrainTimeout: c.drainTimeout, Log: lg,
		PprofListen: c.pprofListen, Global: c.global, GlobalCadence: c.globalCadence,
		TLSCert: c.tlsCert, TLSKey: c.tlsKey, NATSCreds: c.natsCreds, NATSCA: c.natsCA,
		API: c.api,
	}, nil
}

func runNodeCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("presenced node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c commonFlags
	c.register(fs, ":8080")
	var secret, secretFile, pubKeyFile, issuer, audience, origins string
	fs.StringVar(&secret, "jwt-secret", "", "HS256 secret for client tokens (at least 32 bytes)")
	fs.StringVar(&secretFile, "jwt-secret-file", "", "file holding the HS256 secret")
	fs.StringVar(&pubKeyFile, "jwt-public-key-file", "", "PEM public key for client tokens: RSA (RS256), P-256 EC (ES256) or Ed25519 (EdDSA)")
	var jwksURL string
	var jwksRefresh time.Duration
	fs.StringVar(&jwksURL, "jwks-url", "", "JWKS URL of an identity provider: RS256, ES256 and EdDSA tokens are checked with the key their kid names (docs/TOKENS.md)")
	fs.DurationVar(&jwksRefresh, "jwks-refresh", node.DefaultJWKSRefresh, "how often the JWKS is fetched again (a token with an unknown kid fetches it at once, at most every 10s)")
	fs.StringVar(&issuer, "jwt-issuer", "", "required token issuer (iss), if set")
	fs.StringVar(&audience, "jwt-audience", "", "required token audience (aud), if set")
	fs.StringVar(&origins, "allowed-origins", "", "comma-separated Origin values accepted on upgrade (empty: any)")
	fs.BoolVar(&c.insecureDev, "insecure-dev", false, "DEVELOPMENT ONLY: without a token, take the user id from ?user=; serve GET /dev/token, which mints tokens for anyone")
	var demo bool
	fs.BoolVar(&demo, "demo", false, "serve the demo page at / (with --insecure-dev: its tokens come from /dev/token)")
	if err := parseFlags(fs, args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	cfg, err := c.config(stderr)
	if err != nil {
		return err
	}
	fileSecret, err := readFileFlag("jwt-secret-file", secretFile)
	if err != nil {
		return err
	}
	if secret != "" {
		cfg.Auth.HMACSecret = []byte(secret)
	} else if fileSecret != nil {
		cfg.Auth.HMACSecret = []byte(strings.TrimSpace(string(fileSecret)))
	}
	if cfg.Auth.PublicKeyPEM, err = readFileFlag("jwt-public-key-file", pubKeyFile); err != nil {
		return err
	}
	cfg.Auth.JWKSURL, cfg.Auth.JWKSRefresh = jwksURL, jwksRefresh
	cfg.Auth.Issuer, cfg.Auth.Audience = issuer, audience
	if origins != "" {
		cfg.Auth.AllowedOrigins = strings.Split(origins, ",")
	}
	if demo {
		if !cfg.Auth.InsecureDev {
			return &usageError{"--demo needs --insecure-dev: the demo page gets its tokens from /dev/token"}
		}
		cfg.routes = demoRoutes
	}
	if !cfg.Auth.InsecureDev && cfg.Auth.HMACSecret == nil && cfg.Auth.PublicKeyPEM == nil && cfg.Auth.JWKSURL == "" {
		return &usageError{"no client authentication: set --jwt-secret, --jwt-secret-file, --jwt-public-key-file or --jwks-url (or --insecure-dev on a laptop)"}
	}
	if err := cfg.Auth.Validate(); err != nil {
		return &usageError{err.Error()}
	}
	return serve(ctx, cfg)
}
