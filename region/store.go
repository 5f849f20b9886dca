package region

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/presence"
)

// Sink delivers one room's transitions in Seq order. It must be idempotent
// on Transition.ID: after a crash, transitions are delivered again. It
// returns the stream sequence at which the last one was stored, or 0 when
// it does not know one.
type Sink interface {
	Publish(ctx context.Context, ts []presence.Transition) (streamSeq uint64, err error)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(ctx context.Context, ts []presence.Transition) (uint64, error)

// Publish calls f.
func (f SinkFunc) Publish(ctx context.Context, ts []presence.Transition) (uint64, error) {
	return f(ctx, ts)
}

// Store is one region's presence state in Redis. It is safe for concurrent
// use; any number of Stores, in any number of processes, may share a Redis.
// Its locks and goroutines: locksordering.txt.
type Store struct {
	rdb     redis.UniversalClient
	cluster bool
	opt     Options
	t       presence.Timing
	log     *slog.Logger
	now     func() time.Time // local clock: only paces last-seen writes

	mu   sync.Mutex
	seen map[string]time.Time // user -> when this process last wrote their last seen

	clockMu sync.Mutex // clock, out
	clock   clockState
	out     outage
	// incs is the incarnation of each slot's data (by reap index key) as
	// this store last wrote there; see incarnation in lib.lua. held is the
	// incarnation each session this store holds was last written in: a
	// release of a session whose data Redis lost since is its departure.
	incs map[string]string
	held map[presence.SessionRef]heldAt

	outq      chan map[string][]string // with AsyncDelivery
	deliverer sync.Once

	runMu  sync.Mutex // stop, done
	stop   context.CancelFunc
	done   chan struct{}
	closed bool

	holdMu     sync.Mutex // holding, formatNext
	holding    holding    // the holder code and its lease (holders.go)
	leaseLen   time.Duration
	formatNext time.Time // when hold reads the region's format marker again (schema.go)

	format    atomic.Int64                // the format this store writes: the region's (schema.go)
	moveUntil atomic.Int64                // unix ns: until then refreshes move states to format (moveSpan)
	badFormat atomic.Pointer[SchemaError] // the region switched to a format this store cannot read

	stats Stats
	small smallRooms // rooms whose snapshots a transaction reads (snaptx.go)
}

// Start runs the store's reaper (and, with AsyncDelivery, its deliverer)
// in the background until Close. Calls after the first do nothing.
func (s *Store) Start() {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	if s.stop != nil || s.closed {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	s.stop, s.done = stop, make(chan struct{})
	go func() {
		defer close(s.done)
		s.RunReaper(ctx)
	}()
}

// Close stops what Start started and waits for the reaper (the deliverer
// stops with it), then ends the store's holder lease: its node has
// stopped writing, and a region's switch to a new format need not wait
// for the lease to run out (upgrade.go). A write after Close takes a
// lease again. The Redis client is the caller's.
func (s *Store) Close() {
	s.runMu.Lock()
	s.closed = true
	if s.stop != nil {
		s.stop()
		<-s.done
		s.stop = nil
	}
	s.runMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.unhold(ctx)
}

// Stats counts what a Store did.
type Stats struct {
	Touched        atomic.Int64 // sessions created or refreshed
	Released       atomic.Int64
	Transitions    atomic.Int64 // delivered to the sink
	PublishErrors  atomic.Int64
	LastSeenWrites atomic.Int64 // writes Redis reported making
	ReapedRooms    atomic.Int64 // reap script runs
	ClaimedSweeps  atomic.Int64 // cluster masters a periodic sweep claimed and read
	SharedSweeps   atomic.Int64 // cluster masters left to another reaper's claim
	Sweeps         atomic.Int64 // reaper sweeps that read the region's clock
	OutageHolds    atomic.Int64 // outages after which expiries were held
	DataLosses     atomic.Int64 // times the region's Redis was found to have lost its data
	Extended       atomic.Int64 // sessions extended for clients waiting to be admitted (Extend)
}

// New returns a Store on rdb. rdb may be a *redis.Client, a
// *redis.ClusterClient or a failover client. An option it rejects is
// named by a *presence.ConfigError.
func New(rdb redis.UniversalClient, opt Options) (*Store, error) {
	if rdb == nil {
		return nil, &presence.ConfigError{Field: "client", Rule: "is required"}
	}
	opt = opt.WithDefaults()
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	lg := opt.Logger
	if lg == nil {
		lg = slog.Default()
	}
	_, cluster := rdb.(*redis.ClusterClient)
	st := &Store{rdb: rdb, cluster: cluster, opt: opt, t: opt.Timing, log: lg, now: time.Now,
		seen: map[string]time.Time{}, incs: map[string]string{}, held: map[presence.SessionRef]heldAt{},
		holding: holding{nonce: newNonce()}, leaseLen: holdLease}
	st.format.Store(oldestFormat) // until Preload or the first write reads the region's
	if opt.AsyncDelivery {
		st.outq = make(chan map[string][]string, outQueue)
	}
	return st, nil
}

// Timing returns the validated timing in force.
func (s *Store) Timing() presence.Timing { return s.t }

// Stats returns the live counters.
func (s *Store) Stats() *Stats { return &s.stats }

// Ping reports whether Redis answers (on a cluster, every master), and
// fails with a SchemaError once the region has switched to a format this
// store cannot read: a node's health then says why it writes nothing.
func (s *Store) Ping(ctx context.Context) error {
	if se := s.badFormat.Load(); se != nil {
		return se
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
	}
	return s.rdb.Ping(ctx).Err()
}

// Preload caches every script on every Redis node, so the first calls do
// not pay a NOSCRIPT round trip.
func (s *Store) Preload(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		for _, sc := range allScripts {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachShard(ctx, load)
	} else if c, ok := s.rdb.(*redis.Client); ok {
		err = load(ctx, c)
	} else {
		for _, sc := range allScripts {
			if err = sc.Load(ctx, s.rdb).Err(); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = s.checkSchema(ctx)
	}
	var se *SchemaError
	if errors.As(err, &se) {
		return se
	}
	if err != nil {
		return &OpError{"preload", err}
	}
	return nil
}
