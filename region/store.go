package region

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"slices"
	"strconv"
	"strings"
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

// Options configure a Store. Zero fields take their defaults.
type Options struct {
	Region string          // required: names this region in transitions
	Timing presence.Timing // zero fields take presence defaults
	Sink   Sink            // required: receives every transition
	Prefix string          // key prefix; default "presence"
	// Holder names this store's session entries: a release or a state
	// write acts only on the entries of its own holder, and a refresh
	// never takes a session from another. Default: a random id, which is
	// what a node process wants. Two stores in use at once must never
	// share one.
	Holder string

	MaxBatch  int // sessions per Touch; default 10000
	ChunkSize int // sessions per script call; default 256
	// AsyncDelivery hands transitions to the sink from the store's own
	// goroutine, which RunReaper runs: claims, releases, state writes,
	// the heartbeat and the reaper never wait on the bus (an outage of
	// NATS must not stall the heartbeat), and transitions go out in the
	// order their scripts ran. What cannot be queued or delivered stays
	// in the outbox for a reaper's redelivery. Nodes want it; without
	// it each call delivers before it returns.
	AsyncDelivery bool
	// MaxOutbox caps the undelivered events kept per room. 0, the
	// default, is no cap: nothing is dropped however long the bus is out
	// of reach; Redis memory is the bound. At a cap the oldest go and the
	// room starts a new epoch, which tells readers to take a new snapshot.
	MaxOutbox       int
	PublishLease    time.Duration // redeliver events unacknowledged this long; default 5s
	LastSeenBuckets int           // hashes holding last-seen times; default 1024
	Logger          *slog.Logger
}

// Store is one region's presence state in Redis. It is safe for concurrent
// use; any number of Stores, in any number of processes, may share a Redis.
type Store struct {
	rdb     redis.UniversalClient
	cluster bool
	opt     Options
	holder  string
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

	stats Stats
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
}

// New returns a Store on rdb. rdb may be a *redis.Client, a
// *redis.ClusterClient or a failover client.
func New(rdb redis.UniversalClient, opt Options) (*Store, error) {
	if rdb == nil {
		return nil, &ConfigError{"client", "is required"}
	}
	if err := presence.ValidateRegion(opt.Region); err != nil {
		return nil, &ConfigError{"region", err.Error()}
	}
	if opt.Sink == nil {
		return nil, &ConfigError{"sink", "is required: transitions must go somewhere"}
	}
	t := opt.Timing.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&opt.MaxBatch, 10000)
	def(&opt.ChunkSize, 256)
	def(&opt.LastSeenBuckets, 1024)
	if opt.PublishLease == 0 {
		opt.PublishLease = 5 * time.Second
	}
	if opt.Prefix == "" {
		opt.Prefix = "presence"
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"max batch", opt.MaxBatch}, {"chunk size", opt.ChunkSize}, {"max outbox", opt.MaxOutbox}, {"last-seen buckets", opt.LastSeenBuckets}} {
		if c.v < 0 {
			return nil, &ConfigError{c.name, fmt.Sprintf("must be positive, got %d", c.v)}
		}
	}
	// Event ids are deduplicated by JetStream for two minutes; a redelivery
	// must come well inside that window.
	if opt.PublishLease < 100*time.Millisecond || opt.PublishLease > time.Minute {
		return nil, &ConfigError{"publish lease", fmt.Sprintf("must be between 100ms and 1m, got %v", opt.PublishLease)}
	}
	if strings.ContainsAny(opt.Prefix, "{} \t\r\n") {
		return nil, &ConfigError{"prefix", "must not contain braces or whitespace"}
	}
	if opt.Holder == "" {
		opt.Holder = randomHolder()
	}
	if err := checkHolder(opt.Holder); err != nil {
		return nil, err
	}
	lg := opt.Logger
	if lg == nil {
		lg = slog.Default()
	}
	_, cluster := rdb.(*redis.ClusterClient)
	st := &Store{rdb: rdb, cluster: cluster, opt: opt, holder: opt.Holder, t: t, log: lg, now: time.Now,
		seen: map[string]time.Time{}, incs: map[string]string{}, held: map[presence.SessionRef]heldAt{}}
	if opt.AsyncDelivery {
		st.outq = make(chan map[string][]string, outQueue)
	}
	return st, nil
}

// holderBytes is the alphabet of generated holder ids.
const holderBytes = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// randomHolder returns a 6-byte id: 5.7e10 of them, so among a thousand
// nodes at once two share one with a chance of about 1 in 100,000.
func randomHolder() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = holderBytes[int(b[i])%len(holderBytes)]
	}
	return string(b[:])
}

// checkHolder accepts 1 to 16 letters and digits: a holder id is part of
// every entry a store writes, after a ':'.
func checkHolder(h string) error {
	if len(h) == 0 || len(h) > 16 || strings.Trim(h, holderBytes) != "" {
		return &ConfigError{"holder", fmt.Sprintf("must be 1 to 16 letters and digits, got %q", h)}
	}
	return nil
}

// Holder returns the id that names this store's session entries.
func (s *Store) Holder() string { return s.holder }

// Timing returns the validated timing in force.
func (s *Store) Timing() presence.Timing { return s.t }

// Region returns the region name.
func (s *Store) Region() string { return s.opt.Region }

// Stats returns the live counters.
func (s *Store) Stats() *Stats { return &s.stats }

func ms(d time.Duration) int64 { return d.Milliseconds() }

func (s *Store) roomBase(room string) string { return s.opt.Prefix + ":{" + room + "}" }

// roomKeys are the eight keys of a room, in the order the scripts expect.
func (s *Store) roomKeys(room string) []string {
	b := s.roomBase(room)
	return []string{b, b + ":s", b + ":m", b + ":o", b + ":st", b + ":g", b + ":u", b + ":mv"}
}

// indexKey is the reap index for a room. On a cluster there is one per
// slot, keyed to live in that slot; otherwise one for all rooms.
func (s *Store) indexKey(room string) string {
	if !s.cluster {
		return s.opt.Prefix + ":reap"
	}
	return s.indexKeyOfSlot(slotOf(room))
}

func (s *Store) indexKeyOfSlot(slot int) string {
	return s.opt.Prefix + ":reap:{" + slotTags[slot] + "}"
}

// Claim creates sessions, or refreshes them, for this store's holder: a
// join. A session another holder has is taken over, silently (Taken
// names them); the other holder's late writes then change nothing. It
// returns the transitions the call caused. An invalid batch writes
// nothing.
func (s *Store) Claim(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error) {
	return s.touch(ctx, "claim", refs)
}

// Refresh pushes the expiry of sessions this store holds forward: the
// heartbeat path. Sessions are grouped by room and slot into a few script
// calls sent in one round trip. A session that is gone is created again
// (its entry was reaped, or Redis lost it) unless another holder has
// taken it over: those are Lost, and are not written.
func (s *Store) Refresh(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error) {
	return s.touch(ctx, "refresh", refs)
}

func (s *Store) touch(ctx context.Context, op string, refs []presence.SessionRef) (presence.TouchResult, error) {
	var res presence.TouchResult
	if len(refs) == 0 {
		return res, &OpError{op, ErrEmptyBatch}
	}
	if len(refs) > s.opt.MaxBatch {
		return res, &OpError{op, fmt.Errorf("%w: %d sessions, at most %d", ErrBatchTooLarge, len(refs), s.opt.MaxBatch)}
	}
	for i, r := range refs {
		if err := r.Validate(); err != nil {
			return res, &OpError{op, fmt.Errorf("session %d of %d: %w", i+1, len(refs), err)}
		}
	}

	// Sorted by room then user: each room's pairs are one run, and a
	// user's sessions are adjacent, as touch.lua expects.
	sorted := slices.Clone(refs)
	slices.SortStableFunc(sorted, func(a, b presence.SessionRef) int {
		return cmp.Or(strings.Compare(a.Room, b.Room), strings.Compare(a.User, b.User))
	})
	type roomBatch struct {
		room  string
		pairs []any
	}
	var rooms []roomBatch
	for _, r := range sorted {
		if len(rooms) == 0 || rooms[len(rooms)-1].room != r.Room {
			rooms = append(rooms, roomBatch{room: r.Room})
		}
		last := &rooms[len(rooms)-1]
		last.pairs = append(last.pairs, r.User, r.Session)
	}
	byIndex := map[string][]int{}
	var order []string
	for i, rb := range rooms {
		k := s.indexKey(rb.room)
		if _, ok := byIndex[k]; !ok {
			order = append(order, k)
		}
		byIndex[k] = append(byIndex[k], i)
	}

	claim := "0"
	if op == "claim" {
		claim = "1"
	}
	var calls []call
	var callRooms [][]string // rooms of each call, in script order
	expected := s.expectedIncs(sorted)
	for _, k := range order {
		head := []any{ms(s.t.SessionTTL), ms(s.opt.PublishLease), s.opt.MaxOutbox, s.holder, claim, expected[k]}
		c := call{script: scriptTouch, keys: []string{k}, args: append([]any(nil), head...)}
		var names []string
		n := 0
		flush := func() {
			if len(names) > 0 {
				calls = append(calls, c)
				callRooms = append(callRooms, names)
			}
			c = call{script: scriptTouch, keys: []string{k}, args: append([]any(nil), head...)}
			names, n = nil, 0
		}
		for _, i := range byIndex[k] {
			pairs := rooms[i].pairs
			for len(pairs) > 0 {
				take := min(len(pairs)/2, s.opt.ChunkSize-n)
				c.keys = append(c.keys, s.roomKeys(rooms[i].room)...)
				c.args = append(c.args, rooms[i].room, take)
				c.args = append(c.args, pairs[:2*take]...)
				names = append(names, rooms[i].room)
				pairs = pairs[2*take:]
				if n += take; n >= s.opt.ChunkSize {
					flush()
				}
			}
		}
		flush()
	}

	cmds, err := s.exec(ctx, calls)
	if err != nil {
		return res, &OpError{op, err}
	}
	s.stats.Touched.Add(int64(len(refs)))

	pending := map[string][]string{}
	for ci, cmd := range cmds {
		out, _ := cmd.Slice()
		if len(out) == 0 {
			continue
		}
		s.sawIncarnation(calls[ci].keys[0], str(out[0]))
		for ri, v := range out[1:] {
			parts, ok := v.([]any)
			if !ok || ri >= len(callRooms[ci]) || len(parts) != 3 {
				continue
			}
			room := callRooms[ci][ri]
			if entries, ok := parts[0].([]any); ok && len(entries) > 0 {
				pending[room] = append(pending[room], toStrings(entries)...)
			}
			res.Lost = appendRefs(res.Lost, room, parts[1])
			res.Taken = appendRefs(res.Taken, room, parts[2])
		}
	}
	s.noteHeld(refs, res.Lost)
	res.Transitions = s.deliver(ctx, pending)
	s.noteActivity(ctx, refs)
	return res, nil
}

// appendRefs adds the "user:session" items of a script reply as refs of
// room.
func appendRefs(refs []presence.SessionRef, room string, v any) []presence.SessionRef {
	items, _ := v.([]any)
	for _, it := range items {
		if u, sid, ok := strings.Cut(str(it), ":"); ok {
			refs = append(refs, presence.SessionRef{Room: room, User: u, Session: sid})
		}
	}
	return refs
}

// Release records a clean close of one session. The user stays a member
// for the offline grace; if no session of theirs returns, a reaper
// announces the departure. Sessions of the user whose holder has not
// refreshed them for Timing.Unrefreshed do not delay the grace. Releasing
// a session this store does not hold (unknown, or taken over by another
// holder) is a no-op.
func (s *Store) Release(ctx context.Context, ref presence.SessionRef) error {
	if err := ref.Validate(); err != nil {
		return &OpError{"release", err}
	}
	cmds, err := s.exec(ctx, []call{{
		script: scriptRelease,
		keys:   append([]string{s.indexKey(ref.Room)}, s.roomKeys(ref.Room)...),
		args: []any{ms(s.opt.PublishLease), s.opt.MaxOutbox, ms(s.t.OfflineGrace), ref.Room, ref.User, ref.Session,
			s.holder, ms(s.t.SessionTTL), ms(s.t.Unrefreshed()), s.heldInc(ref)},
	}})
	if err != nil {
		return &OpError{"release", err}
	}
	res, _ := cmds[0].Slice()
	if len(res) < 2 {
		return &OpError{"release", fmt.Errorf("short reply of %d items", len(res))}
	}
	if num(res[0]) == 1 {
		s.stats.Released.Add(1)
	}
	s.mu.Lock()
	delete(s.held, ref)
	s.mu.Unlock()
	s.sawIncarnation(s.indexKey(ref.Room), str(res[1]))
	if len(res) > 2 {
		s.deliver(ctx, map[string][]string{ref.Room: toStrings(res[2:])})
	}
	return nil
}

// heldAt is the incarnation a session was last written in, and when.
type heldAt struct {
	inc string
	at  time.Time
}

// noteHeld records the incarnation the sessions of a successful claim or
// refresh were written in (all but the lost ones, which this store no
// longer holds).
func (s *Store) noteHeld(refs, lost []presence.SessionRef) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		s.held[r] = heldAt{inc: s.incs[s.indexKey(r.Room)], at: now}
	}
	for _, r := range lost {
		delete(s.held, r)
	}
}

// expectedIncs is, per reap index key of refs, the incarnation a touch
// expects to find: the oldest refs were last written in, so that if Redis
// lost their data since, the touch restores them (see touch.lua).
func (s *Store) expectedIncs(refs []presence.SessionRef) map[string]string {
	out := map[string]string{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		k := s.indexKey(r.Room)
		inc := s.incs[k]
		if h, ok := s.held[r]; ok && h.inc != "" {
			inc = h.inc
		}
		if cur, ok := out[k]; !ok || (inc != "" && (cur == "" || olderInc(inc, cur))) {
			out[k] = inc
		}
	}
	return out
}

// olderInc compares incarnations, which are creation times in ms.
func olderInc(a, b string) bool {
	x, _ := strconv.ParseInt(a, 10, 64)
	y, _ := strconv.ParseInt(b, 10, 64)
	return x < y
}

// heldInc is the incarnation ref was last written in by this store, or
// the slot's latest if it has not written it.
func (s *Store) heldInc(ref presence.SessionRef) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.held[ref]; ok {
		return h.inc
	}
	return s.incs[s.indexKey(ref.Room)]
}

// sawIncarnation records a slot's incarnation from a script's reply. A
// change means Redis lost that slot's data since this store last wrote
// there; the script has already restored what it could.
func (s *Store) sawIncarnation(idx, inc string) {
	if inc == "" {
		return
	}
	s.mu.Lock()
	prev := s.incs[idx]
	s.incs[idx] = inc
	s.mu.Unlock()
	if prev != "" && prev != inc {
		s.stats.DataLosses.Add(1)
		s.log.Warn("presence: the region's Redis lost its data; this node restores the sessions it holds", "region", s.opt.Region, "index", idx)
	}
}

// Snapshot returns one page of a room's live members, ordered by user id,
// with each member's live sessions and their states, and the sequences
// that join it to the event stream (see presence.Snapshot). A read needs
// no reaper: expired entries are excluded by their score. A room of more
// than 512 sessions pages its member index, so a page costs its own size,
// not the room's; offsets there also count members overdue by less than a
// reap interval, who are left off the page.
func (s *Store) Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error) {
	snap := presence.Snapshot{Region: s.opt.Region, Room: room, Offset: offset}
	if err := presence.ValidateRoom(room); err != nil {
		return snap, &OpError{"snapshot", err}
	}
	if offset < 0 || limit <= 0 {
		return snap, &OpError{"snapshot", fmt.Errorf("offset must be >= 0 and limit > 0, got %d and %d", offset, limit)}
	}
	k := s.roomKeys(room)
	res, err := scriptSnapshot.Run(ctx, s.rdb, []string{k[0], k[1], k[2], k[4], k[6]}, offset, limit, s.readCut(), ms(s.readSlack())).Slice()
	if err != nil {
		return snap, &OpError{"snapshot", err}
	}
	if len(res) < 5 {
		return snap, &OpError{"snapshot", fmt.Errorf("short reply of %d items", len(res))}
	}
	snap.At = time.UnixMilli(num(res[0]))
	snap.RoomSeq = uint64(num(res[1]))
	snap.StreamSeq = uint64(num(res[2]))
	snap.Total = int(num(res[3]))
	snap.Epoch = num(res[4])
	snap.Members = []presence.Member{}
	for i := 5; i+2 < len(res); {
		m := presence.Member{User: str(res[i]), Until: time.UnixMilli(num(res[i+1])), Sessions: []presence.SessionInfo{}}
		k := int(num(res[i+2]))
		i += 3
		for j := 0; j < k && i+2 < len(res); j++ {
			m.Sessions = append(m.Sessions, sessionInfo(res[i], res[i+1], res[i+2]))
			i += 3
		}
		snap.Members = append(snap.Members, m)
	}
	return snap, nil
}

// rosterBatch bounds the rooms of one Rosters pipeline.
const rosterBatch = 100

// Rosters returns whole snapshots of rooms (every member, Offset 0,
// ordered by user id), reading up to 100 rooms per round trip. It serves
// readers of entire regions; clients page with Snapshot. A room's
// snapshot is one atomic read, but different rooms are read at slightly
// different moments.
func (s *Store) Rosters(ctx context.Context, rooms []string) ([]presence.Snapshot, error) {
	for _, room := range rooms {
		if err := presence.ValidateRoom(room); err != nil {
			return nil, &OpError{"rosters", err}
		}
	}
	out := make([]presence.Snapshot, 0, len(rooms))
	for start := 0; start < len(rooms); start += rosterBatch {
		batch := rooms[start:min(start+rosterBatch, len(rooms))]
		calls := make([]call, len(batch))
		for i, room := range batch {
			k := s.roomKeys(room)
			calls[i] = call{script: scriptRoster, keys: []string{k[0], k[1], k[2], k[4]}, args: []any{s.readCut(), ms(s.readSlack())}}
		}
		cmds, err := runAll(ctx, s.rdb, calls)
		if err != nil {
			return nil, &OpError{"rosters", err}
		}
		for i, cmd := range cmds {
			res, err := cmd.Slice()
			if err != nil {
				return nil, &OpError{"rosters", fmt.Errorf("room %s: %w", batch[i], err)}
			}
			snap, err := s.roster(batch[i], res)
			if err != nil {
				return nil, &OpError{"rosters", err}
			}
			out = append(out, snap)
		}
	}
	return out, nil
}

// roster decodes one reply of roster.lua.
func (s *Store) roster(room string, res []any) (presence.Snapshot, error) {
	part := func(i int) []any {
		if i < len(res) {
			a, _ := res[i].([]any)
			return a
		}
		return nil
	}
	head, users, ss, st := part(0), part(1), part(2), part(3)
	if len(res) != 4 || len(head) != 4 || len(users)%2 != 0 || len(ss)%2 != 0 || len(st)%2 != 0 {
		return presence.Snapshot{}, fmt.Errorf("room %s: malformed roster reply", room)
	}
	snap := presence.Snapshot{
		Region: s.opt.Region, Room: room, At: time.UnixMilli(num(head[0])),
		RoomSeq: uint64(num(head[1])), StreamSeq: uint64(num(head[2])), Epoch: num(head[3]),
		Total: len(users) / 2, Members: make([]presence.Member, 0, len(users)/2),
	}
	states := make(map[string]string, len(st)/2)
	for i := 0; i < len(st); i += 2 {
		states[str(st[i])] = str(st[i+1])
	}
	index := make(map[string]int, len(users)/2)
	for i := 0; i < len(users); i += 2 {
		u := str(users[i])
		index[u] = len(snap.Members)
		snap.Members = append(snap.Members, presence.Member{User: u, Until: time.UnixMilli(num(users[i+1])), Sessions: []presence.SessionInfo{}})
	}
	for i := 0; i < len(ss); i += 2 {
		u, rest, ok := strings.Cut(str(ss[i]), ":")
		sid, _, _ := strings.Cut(rest, ":") // then the holder
		j, member := index[u]
		if !ok || !member {
			continue // a live session of a user whose until passed: not a member
		}
		snap.Members[j].Sessions = append(snap.Members[j].Sessions, sessionInfo(sid, ss[i+1], states[u+":"+sid]))
	}
	slices.SortFunc(snap.Members, func(a, b presence.Member) int { return strings.Compare(a.User, b.User) })
	for _, m := range snap.Members {
		slices.SortFunc(m.Sessions, func(a, b presence.SessionInfo) int { return strings.Compare(a.ID, b.ID) })
	}
	return snap, nil
}

func sessionInfo(id, exp, state any) presence.SessionInfo {
	si := presence.SessionInfo{ID: str(id), Expires: time.Unix(num(exp), 0)}
	if st := str(state); st != "" {
		si.State = json.RawMessage(st)
	}
	return si
}

// num reads an integer reply that Redis may send as a number or a string.
func num(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return int64(f)
	}
	return 0
}

// Ping reports whether Redis answers (on a cluster, every master).
func (s *Store) Ping(ctx context.Context) error {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
	}
	return s.rdb.Ping(ctx).Err()
}

// Count returns the number of live members of a room without listing them.
func (s *Store) Count(ctx context.Context, room string) (int, error) {
	if err := presence.ValidateRoom(room); err != nil {
		return 0, &OpError{"count", err}
	}
	n, err := scriptCount.Run(ctx, s.rdb, []string{s.roomBase(room)}, s.readCut(), ms(s.readSlack())).Int()
	if err != nil {
		return 0, &OpError{"count", err}
	}
	return n, nil
}

// Sessions returns one user's presence in a room: ok is false when the
// user is not a member. A member with no sessions is inside the grace.
func (s *Store) Sessions(ctx context.Context, room, user string) (m presence.Member, ok bool, err error) {
	if err := presence.ValidateRoom(room); err != nil {
		return m, false, &OpError{"sessions", err}
	}
	if err := presence.ValidateUser(user); err != nil {
		return m, false, &OpError{"sessions", err}
	}
	k := s.roomKeys(room)
	res, err := scriptSessions.Run(ctx, s.rdb, []string{k[1], k[4], k[0], k[6]}, user, s.readCut(), ms(s.readSlack())).Slice()
	if err != nil {
		return m, false, &OpError{"sessions", err}
	}
	now := num(res[0])
	m = presence.Member{User: user, Sessions: []presence.SessionInfo{}}
	if str(res[1]) != "" && num(res[1]) >= now {
		ok, m.Until = true, time.UnixMilli(num(res[1]))
	}
	for i := 2; i+2 < len(res); i += 3 {
		m.Sessions = append(m.Sessions, sessionInfo(res[i], res[i+1], res[i+2]))
	}
	return m, ok, nil
}

// SetState sets (or, with nil, clears) the state of a live session this
// store holds. A change produces an update transition; membership does
// not change. It returns false when the session is not live, and an
// error wrapping presence.ErrMoved when another holder has taken it over;
// either way it writes nothing.
func (s *Store) SetState(ctx context.Context, ref presence.SessionRef, state json.RawMessage) (bool, error) {
	if err := ref.Validate(); err != nil {
		return false, &OpError{"set state", err}
	}
	if len(state) > presence.MaxStateBytes {
		return false, &OpError{"set state", fmt.Errorf("state is %d bytes, at most %d", len(state), presence.MaxStateBytes)}
	}
	if len(state) > 0 && !json.Valid(state) {
		return false, &OpError{"set state", errors.New("state is not valid JSON")}
	}
	var buf bytes.Buffer
	if len(state) > 0 {
		if err := json.Compact(&buf, state); err != nil {
			return false, &OpError{"set state", err}
		}
	}
	cmds, err := s.exec(ctx, []call{{
		script: scriptState,
		keys:   append([]string{s.indexKey(ref.Room)}, s.roomKeys(ref.Room)...),
		args: []any{ms(s.opt.PublishLease), s.opt.MaxOutbox, ref.Room, ref.User, ref.Session, buf.String(), s.holder,
			s.heldInc(ref)},
	}})
	if err != nil {
		return false, &OpError{"set state", err}
	}
	res, _ := cmds[0].Slice()
	if len(res) < 2 {
		return false, &OpError{"set state", fmt.Errorf("short reply of %d items", len(res))}
	}
	s.sawIncarnation(s.indexKey(ref.Room), str(res[1]))
	if len(res) > 2 {
		s.deliver(ctx, map[string][]string{ref.Room: toStrings(res[2:])})
	}
	if num(res[0]) == 2 {
		return false, &OpError{"set state", presence.ErrMoved}
	}
	return num(res[0]) == 1, nil
}

// outQueue bounds the deliveries waiting for the deliverer (with
// AsyncDelivery); past it they are left to the reaper's redelivery.
const outQueue = 4096

// deliver hands each room's outbox entries to the sink, at once or, with
// AsyncDelivery, through the deliverer; it returns their transitions.
func (s *Store) deliver(ctx context.Context, pending map[string][]string) []presence.Transition {
	if len(pending) == 0 {
		return nil
	}
	if s.outq == nil {
		return s.deliverNow(ctx, pending)
	}
	var ts []presence.Transition
	for room, entries := range pending {
		for _, e := range entries {
			if t, err := s.parseEvent(room, e); err == nil {
				ts = append(ts, t)
			}
		}
	}
	select {
	case s.outq <- pending:
	default:
		s.stats.PublishErrors.Add(1)
		s.log.Warn("presence: delivery queue full; a reaper will deliver", "rooms", len(pending))
	}
	return ts
}

// runDeliverer delivers what deliver queued, until ctx is done. It takes
// what is waiting in one go, a room's entries in the order queued.
func (s *Store) runDeliverer(ctx context.Context) {
	for {
		var first map[string][]string
		select {
		case <-ctx.Done():
			return
		case first = <-s.outq:
		}
		merged := map[string][]string{}
		for room, es := range first {
			merged[room] = append(merged[room], es...)
		}
	more:
		for range 255 {
			select {
			case p := <-s.outq:
				for room, es := range p {
					merged[room] = append(merged[room], es...)
				}
			default:
				break more
			}
		}
		dctx, cancel := context.WithTimeout(ctx, s.opt.PublishLease)
		s.deliverRooms(dctx, merged)
		cancel()
	}
}

// ackTimeout bounds the acknowledgement of delivered entries.
const ackTimeout = 2 * time.Second

// deliverParallel bounds the rooms one delivery round publishes at once.
const deliverParallel = 64

// deliverRooms delivers each room's entries from its own goroutine and
// waits for all: a round costs about one publish round trip, not one per
// room. A room's entries stay in one goroutine and rounds do not overlap,
// so each room's transitions still reach the sink in seq order.
func (s *Store) deliverRooms(ctx context.Context, pending map[string][]string) {
	if len(pending) == 1 {
		s.deliverNow(ctx, pending)
		return
	}
	sem := make(chan struct{}, deliverParallel)
	var wg sync.WaitGroup
	for room, entries := range pending {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.deliverNow(ctx, map[string][]string{room: entries})
		}()
	}
	wg.Wait()
}

// deliverNow hands each room's outbox entries to the sink and acknowledges
// the delivered ones. Entries it cannot deliver stay in the outbox, and a
// reaper delivers them after the publish lease.
func (s *Store) deliverNow(ctx context.Context, pending map[string][]string) []presence.Transition {
	var all []presence.Transition
	var acks []call
	var seen []presence.Transition
	for room, entries := range pending {
		ts := make([]presence.Transition, 0, len(entries))
		ack := []any{ms(s.opt.PublishLease), room, 0, 0}
		for _, e := range entries {
			ack = append(ack, e)
			t, err := s.parseEvent(room, e)
			if err != nil {
				s.log.Error("presence: dropping malformed outbox entry", "room", room, "entry", e, "err", err)
				continue
			}
			ts = append(ts, t)
		}
		if len(ts) == 0 {
			continue
		}
		sseq, err := s.opt.Sink.Publish(ctx, ts)
		if err != nil {
			s.stats.PublishErrors.Add(1)
			s.log.Warn("presence: publish failed; a reaper will retry", "room", room, "events", len(ts), "err", err)
			continue
		}
		s.stats.Transitions.Add(int64(len(ts)))
		ack[2], ack[3] = ts[len(ts)-1].Seq, sseq
		all = append(all, ts...)
		for _, t := range ts {
			if t.Kind == presence.Online || t.Kind == presence.Offline {
				seen = append(seen, t)
			}
		}
		acks = append(acks, call{
			script: scriptAck,
			keys:   append([]string{s.indexKey(room)}, s.roomKeys(room)...),
			args:   ack,
		})
	}
	// The acks and the last-seen writes of joins and departures go in one
	// round trip.
	calls := append(acks, s.seenCalls(s.departuresSeen(seen))...)
	if len(calls) > 0 {
		// Stored events are acked even when the publish used up ctx: an
		// unacked entry is delivered again after the lease.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
		defer cancel()
		cmds, _ := runAll(actx, s.rdb, calls)
		for i, c := range cmds {
			if err := c.Err(); err != nil && i < len(acks) {
				s.log.Warn("presence: ack failed; events will be delivered again", "err", err)
			}
		}
		s.countSeen(cmds[len(acks):])
	}
	return all
}

func (s *Store) parseEvent(room, e string) (presence.Transition, error) {
	f := strings.SplitN(e, "|", 9)
	if len(f) != 9 {
		return presence.Transition{}, fmt.Errorf("want 9 fields, got %d", len(f))
	}
	seq, err1 := strconv.ParseUint(f[0], 10, 64)
	n, err2 := strconv.Atoi(f[5])
	at, err3 := strconv.ParseInt(f[6], 10, 64)
	epoch, err4 := strconv.ParseInt(f[1], 10, 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return presence.Transition{}, err
	}
	t := presence.Transition{
		ID:       s.opt.Region + "/" + room + "/" + f[1] + "/" + f[0],
		Region:   s.opt.Region,
		Room:     room,
		User:     f[4],
		Kind:     presence.Kind(f[2]),
		Reason:   presence.Reason(f[3]),
		Sessions: n,
		Seq:      seq,
		Epoch:    epoch,
		At:       time.UnixMilli(at),
		Session:  f[7],
	}
	if f[8] != "" {
		t.State = json.RawMessage(f[8])
	}
	return t, nil
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
	if err != nil {
		return &OpError{"preload", err}
	}
	return nil
}

func toStrings(v []any) []string {
	out := make([]string, 0, len(v))
	for _, x := range v {
		out = append(out, str(x))
	}
	return out
}

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// seenKey is the bucket hash holding a user's last-seen time.
func (s *Store) seenKey(user string) string {
	b := crc32.ChecksumIEEE([]byte(user)) % uint32(s.opt.LastSeenBuckets)
	return s.opt.Prefix + ":seen:{" + strconv.FormatUint(uint64(b), 10) + "}"
}

type seenWrite struct {
	user  string
	at    int64 // ms; 0 means Redis's now
	force bool
}

// noteActivity writes last seen for users active in a touch, at most once
// per last-seen interval per user from this process (the script enforces
// the interval across processes).
func (s *Store) noteActivity(ctx context.Context, refs []presence.SessionRef) {
	now := s.now()
	var ws []seenWrite
	s.mu.Lock()
	for _, r := range refs {
		if last, ok := s.seen[r.User]; ok && now.Sub(last) < s.t.LastSeenInterval {
			continue
		}
		s.seen[r.User] = now
		ws = append(ws, seenWrite{user: r.User})
	}
	s.mu.Unlock()
	s.flushSeen(ctx, ws)
}

// departuresSeen turns joins and departures into forced last-seen writes.
func (s *Store) departuresSeen(ts []presence.Transition) []seenWrite {
	if len(ts) == 0 {
		return nil
	}
	now := s.now()
	ws := make([]seenWrite, 0, len(ts))
	s.mu.Lock()
	for _, t := range ts {
		s.seen[t.User] = now
		ws = append(ws, seenWrite{user: t.User, at: t.At.UnixMilli(), force: true})
	}
	s.mu.Unlock()
	return ws
}

func (s *Store) flushSeen(ctx context.Context, ws []seenWrite) {
	if len(ws) == 0 {
		return
	}
	cmds, err := runAll(ctx, s.rdb, s.seenCalls(ws))
	if err != nil {
		s.log.Warn("presence: last-seen write failed", "err", err)
	}
	s.countSeen(cmds)
}

// countSeen adds the writes that seen.lua calls report to the stats.
func (s *Store) countSeen(cmds []*redis.Cmd) {
	for _, c := range cmds {
		if n, err := c.Int64(); err == nil {
			s.stats.LastSeenWrites.Add(n)
		}
	}
}

// seenCalls groups last-seen writes into one seen.lua call per bucket.
func (s *Store) seenCalls(ws []seenWrite) []call {
	if len(ws) == 0 {
		return nil
	}
	byKey := map[string][]any{}
	for _, w := range ws {
		k := s.seenKey(w.user)
		f := 0
		if w.force {
			f = 1
		}
		byKey[k] = append(byKey[k], w.user, w.at, f)
	}
	calls := make([]call, 0, len(byKey))
	for k, args := range byKey {
		calls = append(calls, call{script: scriptSeen, keys: []string{k}, args: append([]any{ms(s.t.LastSeenInterval)}, args...)})
	}
	return calls
}

// pruneSeen forgets users this process has not written for two intervals,
// bounding the map by the users it serves.
func (s *Store) pruneSeen() {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for u, t := range s.seen {
		if now.Sub(t) > 2*s.t.LastSeenInterval {
			delete(s.seen, u)
		}
	}
	// Sessions this store stopped refreshing without a release (a drain,
	// or another store took them over) are forgotten the same way.
	for r, h := range s.held {
		if now.Sub(h.at) > 2*s.t.SessionTTL {
			delete(s.held, r)
		}
	}
}

// LastSeen returns when the user was last seen active in this region, to
// the second.
func (s *Store) LastSeen(ctx context.Context, user string) (time.Time, bool, error) {
	if err := presence.ValidateUser(user); err != nil {
		return time.Time{}, false, &OpError{"last seen", err}
	}
	v, err := s.rdb.HGet(ctx, s.seenKey(user), user).Int64()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, &OpError{"last seen", err}
	}
	return time.Unix(v, 0), true, nil
}
