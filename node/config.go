package node

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// Store is what a node needs of the regional store; *region.Store
// implements it. A store that also has Ping(ctx) error (*region.Store
// pings Redis) is asked by the health endpoint. The store owns the
// region's timing and runs its own reaper: the node only reads the
// timing, to pace its heartbeat.
type Store interface {
	// Claim creates sessions for this node, taking them over from any
	// other node (a join).
	Claim(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error)
	// Refresh keeps this node's sessions alive (the heartbeat); sessions
	// another node took over are reported Lost and not written.
	Refresh(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error)
	// Release records a clean close of a session this node holds; the
	// offline grace applies. A session it no longer holds is left alone.
	Release(ctx context.Context, ref presence.SessionRef) error
	// SetState sets or (nil) clears the state of a live session this node
	// holds; false means the session is not live, an error wrapping
	// presence.ErrMoved that another node holds it. Either way nothing
	// was written.
	SetState(ctx context.Context, ref presence.SessionRef, state json.RawMessage) (bool, error)
	// Snapshot returns one page of a room's members and its RoomSeq.
	Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error)
	// Timing is the region's timing, defaults filled and validated.
	Timing() presence.Timing
	// Extend keeps the existing sessions of clients whose joins were
	// refused as they are (another node's, or released ones in their
	// grace, included) for a session TTL, creating and announcing nothing;
	// it returns how many it found.
	Extend(ctx context.Context, refs []presence.SessionRef) (int, error)
}

// Snapshotter returns pages of a room's members with the sequences that
// join them to the room's event stream: the regional store, or the
// cross-region aggregators' query service (global.Client).
type Snapshotter interface {
	Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error)
}

// Config configures a Node. Zero fields take the defaults documented on
// each field; see New.
type Config struct {
	Region string     // required: the store's region, used for NATS subjects
	Store  Store      // required
	NATS   *nats.Conn // required: room events are watched here

	// Global, when set, makes clients see the cross-region view: room
	// snapshots come from it and events from presence.global.<room>.>.
	// Set it when several regions are configured. Sessions and state are
	// always written to the regional Store.
	Global Snapshotter

	Auth   AuthConfig
	Limits Limits

	// Revocations, when set, is read at Start and every heartbeat for the
	// users the server API revoked (see revoke.go); nil: the node keeps
	// only the revocations it is told of while it runs.
	Revocations Revocations

	// HeartbeatSlots spreads the refreshes: slot i of N is touched every
	// Heartbeat, Heartbeat/N after slot i-1. Default 10.
	HeartbeatSlots int
	// StoreTimeout bounds the store calls made for one client frame and
	// for one heartbeat batch. Default 5s.
	StoreTimeout time.Duration

	// FanoutTick is how often batched events and counts go out (see
	// docs/PROTOCOL.md, "Big rooms"): a room's events of one tick reach a
	// member taking events frames as one frame, and a count member gets at
	// most one count per tick. Default 100ms; at least 5ms.
	FanoutTick time.Duration
	// BatchFrom is the local member count from which a room's events are
	// batched for the members that take events frames; smaller rooms get
	// one frame per event, at once. Default 100; negative: never.
	BatchFrom int
	// FanoutBudget is the most frames per second the tick sends (batches
	// and counts, over every room): when the busy rooms' members would
	// take more at one frame per FanoutTick, each room goes out less
	// often, every members/FanoutBudget seconds, and its frames carry
	// more events; its members then take turns, a share of them every
	// quarter tick, so that no tick writes to all of them at once.
	// Writing a frame to a socket costs about the same whatever it
	// holds, so this bounds the node's fan-out CPU whatever the churn.
	// Default 50000; negative: no bound.
	FanoutBudget int
	// NoCompression turns permessage-deflate off. On (the default), a
	// client that offers it gets the events frames of batched rooms
	// compressed, once per frame for all such members (the frames every
	// member shares); every other frame goes out plain.
	NoCompression bool

	// Build describes the running binary (version, commit, Go, protocol,
	// data format); the health endpoint shows it as it is.
	Build map[string]string
	// Checks are more health checks, by name: while one returns an error
	// the node reports itself degraded (503), e.g. "stream" while
	// transitions cannot be stored.
	Checks map[string]func() error

	Logger *slog.Logger // default slog.Default()
	// Metrics receives the node's collectors. Default: a new registry.
	// /metrics serves it when it is also a prometheus.Gatherer.
	Metrics prometheus.Registerer

	gapTimeout time.Duration // tests shorten it
	heartbeat  time.Duration // the store's, filled by WithDefaults
}

// Limits protect a node from any one client and size its memory. Zero
// fields take the defaults shown.
type Limits struct {
	// MaxConnections per node; more are refused with HTTP 503 before the
	// upgrade. Default 15000, which keeps a node under a 20000 open-file
	// limit with room for Redis, NATS and listeners.
	MaxConnections int
	// MaxFrameBytes is the largest client frame; a larger one closes the
	// connection with 1009. Default 4096.
	MaxFrameBytes int
	// MaxRooms per connection; a join beyond it is refused with the error
	// code too_many_rooms. Default 32.
	MaxRooms int
	// MaxWatches is the most rooms one connection watches (too_many_rooms
	// past it), MaxWatchUsers the most users of one watch (invalid_watch).
	// Defaults 32 and 100; MaxWatchUsers at most 1000.
	MaxWatches    int
	MaxWatchUsers int
	// FrameRate and FrameBurst are a token bucket over every client frame
	// (joins, leaves, state, pings). Defaults 10/s and 20.
	FrameRate  float64
	FrameBurst int
	// RateStrikes rate-limited frames within RateWindow close the
	// connection with 1008, the rule in the close frame's reason: a
	// client over the rate is closed however many of its frames get
	// through. Defaults 10 and 10s.
	RateStrikes int
	RateWindow  time.Duration
	// SendQueue frames may wait for a slow client before it is closed
	// with 4000. Default 256.
	SendQueue int
	// SnapshotMembers is the most members sent in one snapshot. Default
	// 1000.
	SnapshotMembers int
	// PingInterval is how often the node pings each client; a client that
	// does not answer within PongTimeout (plus StoreTimeout, since pongs
	// are read between frames) is dropped and released. Defaults 25s, 10s.
	PingInterval time.Duration
	PongTimeout  time.Duration
	// WriteTimeout bounds one write to a client (on a WrapListener
	// connection up to a second more: its deadline moves once a second,
	// not per frame). Default 10s.
	WriteTimeout time.Duration
	// CloseTimeout bounds the wait for a client's answer to a close frame.
	// Default 2s.
	CloseTimeout time.Duration
	// TouchBatch is the most sessions in one store Refresh; it must not
	// exceed the store's MaxBatch. Default 1000.
	TouchBatch int
	// MaxInflight bounds the client requests that wait on the store at
	// once (join, leave, state, members). A request that finds no room
	// for AdmitWait is refused with the error code unavailable and a
	// retry_after_ms: past its capacity a node answers at once instead of
	// piling requests up until they time out. Defaults 512 and 1s (a storm of 1,000 joins into a room of 15,000 waits 3.2 s at p99 with 128, docs/BENCHMARKS.md).
	MaxInflight int
	AdmitWait   time.Duration
	// JoinRate bounds the joins per second that claim a session (the
	// store's costly write) on this node. Past it a join is refused with
	// unavailable and a retry_after_ms that spreads the refused clients
	// over the time the node needs to admit them all, and the sessions of
	// refused clients are kept as they were while they retry (see
	// docs/PROTOCOL.md, "Reconnect storms"). The rate follows the store:
	// an admitted join whose claim takes longer than
	// JoinLatency cuts it by 30 %, down to
	// JoinRateMin; calls in time raise it back. Defaults 2000/s, 100/s and
	// 250ms; a negative JoinRate: no bound.
	JoinRate    float64
	JoinRateMin float64
	JoinLatency time.Duration
	// MaxRetryAfter caps the retry_after_ms of refusals. A refused
	// client's session is extended a session TTL at most once per
	// heartbeat, so the cap must let a client that honours it (with up to
	// 25 % jitter) come back in time: heartbeat + MaxRetryAfter*5/4 + the
	// extender's period <= the session TTL. Default min(20s, (TTL -
	// heartbeat)/2): 15s at the default timing.
	MaxRetryAfter time.Duration
	// MaxHTTPConns bounds the plain HTTP connections (not WebSockets) of
	// a server whose ConnState is the node's: past it, a new connection
	// closes the one idle the longest, so a flood of idle connections
	// never locks clients out. Default 1024. Give the server an
	// IdleTimeout too.
	MaxHTTPConns int
	// ReadBufferBytes sizes each connection's read buffer (frames may be
	// larger; client frames are small). WriteBufferBytes sizes the pooled
	// write buffers, which idle connections do not hold. Defaults 512 and
	// 4096.
	ReadBufferBytes  int
	WriteBufferBytes int
}

const (
	// minRetryAfter is the shortest retry hint.
	minRetryAfter = 250 * time.Millisecond
	// maxWaiting bounds the refused sessions queued for an extension.
	maxWaiting = 200000
)

// Defaults for Limits and Config.
const (
	DefaultMaxConnections   = 15000
	DefaultMaxFrameBytes    = 4096
	DefaultMaxRooms         = 32
	DefaultFrameRate        = 10
	DefaultFrameBurst       = 20
	DefaultRateStrikes      = 10
	DefaultRateWindow       = 10 * time.Second
	DefaultSendQueue        = 256
	DefaultSnapshotMembers  = 1000
	DefaultPingInterval     = 25 * time.Second
	DefaultPongTimeout      = 10 * time.Second
	DefaultWriteTimeout     = 10 * time.Second
	DefaultCloseTimeout     = 2 * time.Second
	DefaultTouchBatch       = 1000
	DefaultMaxInflight      = 512
	DefaultMaxHTTPConns     = 1024
	DefaultAdmitWait        = time.Second
	DefaultJoinRate         = 2000
	DefaultJoinRateMin      = 100
	DefaultJoinLatency      = 250 * time.Millisecond
	DefaultReadBufferBytes  = 512
	DefaultWriteBufferBytes = 4096
	DefaultHeartbeatSlots   = 10
	DefaultStoreTimeout     = 5 * time.Second
	DefaultFanoutTick       = 100 * time.Millisecond
	DefaultBatchFrom        = 100
	DefaultFanoutBudget     = 50000
	DefaultMaxWatches       = 32
	DefaultMaxWatchUsers    = 100
	// maxWatchUsersCap is region.MaxUsersRead: one watch is one read.
	maxWatchUsersCap = 1000
)

// configError reports a setting New rejected, as the project's one config
// error type: callers match *presence.ConfigError with errors.As, and the
// message says it is the node's ("node: presence: config: <field>: <rule>").
func configError(field, rule string) error {
	return fmt.Errorf("node: %w", &presence.ConfigError{Field: field, Rule: rule})
}

// WithDefaults returns l with every zero field set to its default, but
// MaxRetryAfter, whose default follows the store's timing
// (Config.WithDefaults fills it).
func (l Limits) WithDefaults() Limits {
	defI := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defI(&l.MaxConnections, DefaultMaxConnections)
	defI(&l.MaxFrameBytes, DefaultMaxFrameBytes)
	defI(&l.MaxRooms, DefaultMaxRooms)
	defI(&l.MaxWatches, DefaultMaxWatches)
	defI(&l.MaxWatchUsers, DefaultMaxWatchUsers)
	if l.FrameRate == 0 {
		l.FrameRate = DefaultFrameRate
	}
	defI(&l.FrameBurst, DefaultFrameBurst)
	defI(&l.RateStrikes, DefaultRateStrikes)
	defD(&l.RateWindow, DefaultRateWindow)
	defI(&l.SendQueue, DefaultSendQueue)
	defI(&l.SnapshotMembers, DefaultSnapshotMembers)
	defD(&l.PingInterval, DefaultPingInterval)
	defD(&l.PongTimeout, DefaultPongTimeout)
	defD(&l.WriteTimeout, DefaultWriteTimeout)
	defD(&l.CloseTimeout, DefaultCloseTimeout)
	defI(&l.TouchBatch, DefaultTouchBatch)
	defI(&l.MaxInflight, DefaultMaxInflight)
	defI(&l.MaxHTTPConns, DefaultMaxHTTPConns)
	defD(&l.AdmitWait, DefaultAdmitWait)
	if l.JoinRate == 0 {
		l.JoinRate = DefaultJoinRate
	}
	if l.JoinRateMin == 0 {
		l.JoinRateMin = min(DefaultJoinRateMin, l.JoinRate)
	}
	defD(&l.JoinLatency, DefaultJoinLatency)
	defI(&l.ReadBufferBytes, DefaultReadBufferBytes)
	defI(&l.WriteBufferBytes, DefaultWriteBufferBytes)
	return l
}

// Validate checks l as given: call WithDefaults first to fill zero
// fields. MaxRetryAfter, bound by the store's timing, is checked by
// Config.Validate.
func (l Limits) Validate() error {
	for _, c := range []struct {
		name string
		v    int
	}{
		{"max connections", l.MaxConnections}, {"max frame bytes", l.MaxFrameBytes}, {"max rooms", l.MaxRooms},
		{"max watches", l.MaxWatches}, {"max watch users", l.MaxWatchUsers},
		{"frame burst", l.FrameBurst}, {"rate strikes", l.RateStrikes}, {"send queue", l.SendQueue},
		{"snapshot members", l.SnapshotMembers}, {"touch batch", l.TouchBatch}, {"max inflight", l.MaxInflight}, {"max http conns", l.MaxHTTPConns},
		{"read buffer bytes", l.ReadBufferBytes}, {"write buffer bytes", l.WriteBufferBytes},
	} {
		if c.v <= 0 {
			return configError("limits: "+c.name, fmt.Sprintf("must be positive, got %d", c.v))
		}
	}
	for _, c := range []struct {
		name string
		d    time.Duration
	}{
		{"ping interval", l.PingInterval}, {"pong timeout", l.PongTimeout},
		{"write timeout", l.WriteTimeout}, {"close timeout", l.CloseTimeout}, {"admit wait", l.AdmitWait},
		{"rate window", l.RateWindow},
	} {
		if c.d <= 0 {
			return configError("limits: "+c.name, fmt.Sprintf("must be positive, got %v", c.d))
		}
	}
	if l.MaxWatchUsers > maxWatchUsersCap {
		return configError("limits: max watch users", fmt.Sprintf("must be at most %d, got %d", maxWatchUsersCap, l.MaxWatchUsers))
	}
	if l.JoinRate > 0 && (l.JoinRateMin <= 0 || l.JoinRateMin > l.JoinRate) {
		return configError("limits: join rate min", fmt.Sprintf("must be positive and at most the join rate %g, got %g", l.JoinRate, l.JoinRateMin))
	}
	if l.JoinLatency <= 0 {
		return configError("limits: join latency", fmt.Sprintf("must be positive, got %v", l.JoinLatency))
	}
	if l.FrameRate <= 0 {
		return configError("limits: frame rate", fmt.Sprintf("must be positive, got %v", l.FrameRate))
	}
	// A state frame carries up to MaxStateBytes of state plus its envelope.
	if l.MaxFrameBytes < presence.MaxStateBytes+presence.MaxRoomLen+256 {
		return configError("limits: max frame bytes", fmt.Sprintf("must be at least %d to carry a full state frame, got %d",
			presence.MaxStateBytes+presence.MaxRoomLen+256, l.MaxFrameBytes))
	}
	return nil
}

// WithDefaults returns c with every zero field set to its default. The
// defaults that follow the store's timing (the heartbeat, MaxRetryAfter)
// are filled only when Store is set.
func (c Config) WithDefaults() Config {
	c.Limits = c.Limits.WithDefaults()
	if c.Store != nil {
		c.heartbeat = c.Store.Timing().Heartbeat
		if c.Limits.MaxRetryAfter == 0 {
			c.Limits.MaxRetryAfter = min(20*time.Second, (c.Store.Timing().SessionTTL-c.heartbeat)/2)
		}
	}
	if c.HeartbeatSlots == 0 {
		c.HeartbeatSlots = DefaultHeartbeatSlots
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.FanoutTick == 0 {
		c.FanoutTick = DefaultFanoutTick
	}
	if c.BatchFrom == 0 {
		c.BatchFrom = DefaultBatchFrom
	}
	if c.FanoutBudget == 0 {
		c.FanoutBudget = DefaultFanoutBudget
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = prometheus.NewRegistry()
	}
	return c
}

// Validate checks c as given: call WithDefaults first to fill zero
// fields. Auth is checked by New, which builds the authenticator.
func (c Config) Validate() error {
	if err := bus.ValidateRegion(c.Region); err != nil {
		return configError("region", err.Error())
	}
	if c.Store == nil {
		return configError("store", "is required")
	}
	if c.NATS == nil {
		return configError("nats", "is required: room events are watched on it")
	}
	// The store validated its timing; a heartbeat of zero would still
	// stop the keeper, so say so here rather than at the first tick.
	heartbeat := c.Store.Timing().Heartbeat
	if heartbeat <= 0 {
		return configError("store timing", fmt.Sprintf("heartbeat must be positive, got %v", heartbeat))
	}
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	if err := c.validateRetry(heartbeat); err != nil {
		return err
	}
	if c.HeartbeatSlots < 1 || c.HeartbeatSlots > 1000 {
		return configError("heartbeat slots", fmt.Sprintf("must be between 1 and 1000, got %d", c.HeartbeatSlots))
	}
	if heartbeat/time.Duration(c.HeartbeatSlots) < time.Millisecond {
		return configError("heartbeat slots", fmt.Sprintf("%d slots make ticks shorter than 1ms for a %v heartbeat", c.HeartbeatSlots, heartbeat))
	}
	if c.StoreTimeout < 0 {
		return configError("store timeout", fmt.Sprintf("must be positive, got %v", c.StoreTimeout))
	}
	if c.FanoutTick < 5*time.Millisecond {
		return configError("fanout tick", fmt.Sprintf("must be at least 5ms, got %v", c.FanoutTick))
	}
	return nil
}

// extendEvery is how often a node sends its refused clients' sessions
// to be extended: a client refused this long before its session expires
// may find it gone, so it is short (a storm measured 561 of 141,076 such
// sessions lost at 1 s).
func (c Config) extendEvery() time.Duration { return extendEvery(c.heartbeat) }

func extendEvery(heartbeat time.Duration) time.Duration {
	return min(250*time.Millisecond, heartbeat/4)
}

// validateRetry checks that a refused client who honours MaxRetryAfter
// comes back before its extended session ends.
func (c Config) validateRetry(heartbeat time.Duration) error {
	ttl := c.Store.Timing().SessionTTL
	extend := extendEvery(heartbeat)
	room := ttl - heartbeat - extend
	if m := c.Limits.MaxRetryAfter; m < minRetryAfter || m*5/4 > room {
		return configError("limits: max retry after", fmt.Sprintf("must be between %v and %v (session TTL %v - heartbeat %v - %v, over 5/4 for a client's jitter), got %v",
			minRetryAfter, room*4/5, ttl, heartbeat, extend, m))
	}
	return nil
}

// viewRegion is the region token of the events clients see.
func (c Config) viewRegion() string {
	if c.Global != nil {
		return bus.GlobalRegion
	}
	return c.Region
}

// snapshots is where clients' room snapshots come from.
func (c Config) snapshots() Snapshotter {
	if c.Global != nil {
		return c.Global
	}
	return c.Store
}
