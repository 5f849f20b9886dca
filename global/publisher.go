package global

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// payloadSlack is kept free of each publication for its envelope.
const payloadSlack = 1024

// publisherStartTimeout bounds finding (or creating) the lease bucket.
const publisherStartTimeout = 30 * time.Second

// RegionPublisher publishes one region's presence to the aggregators:
// once per cadence it sends what changed since the last cadence (an empty
// delta when nothing did: the region's liveness signal). From a
// ChangeSource it reads only the members the change log names, plus a
// slice of rooms that it compares with what it published (the whole
// region every CheckEvery cadences), so what the log missed is repaired;
// every FullEvery cadences a delta carries the digest of the published
// view, and an aggregator whose copy differs asks for a full. It sends a
// full when it becomes active and when an aggregator asks.
//
// Run one in every node of the region: a lease in the region's KV bucket
// makes exactly one of them active. The others wait, holding nothing.
type RegionPublisher struct {
	cfg   PublisherConfig
	log   *slog.Logger
	stats PublisherStats

	mu          sync.Mutex
	active      bool
	term        uint64 // counts the terms this publisher was active
	gen, seq    uint64
	last        truth    // what the aggregators hold, as far as we know
	known       entrySet // the entries of the members in last, from a ChangeSource
	cursor      string   // the change log's, after what last holds
	fullDue     bool
	sinceFull   int // cadences since the last full
	sinceDigest int // cadences since the last digest

	// The anti-entropy check's pass over the region's rooms; only the
	// cadence goroutine uses them.
	pass     []string
	passStep int // slices of pass read so far

	cancel context.CancelFunc
	wg     sync.WaitGroup
	subs   []*nats.Subscription
	lease  *lease
	once   sync.Once
}

// PublisherStats counts what a RegionPublisher did.
type PublisherStats struct {
	Deltas     atomic.Int64 // delta messages sent (empty ones included)
	Fulls      atomic.Int64 // full snapshots sent (not parts)
	Bytes      atomic.Int64 // publication bytes sent
	ReadErrors atomic.Int64 // cadences skipped because the truth could not be read
	SendErrors atomic.Int64
	Resyncs    atomic.Int64 // resync requests received
	WholeReads atomic.Int64 // reads of the whole region (fulls; a change log that could not say)
	Repairs    atomic.Int64 // members the anti-entropy check found changed that the change log missed
}

// NewRegionPublisher checks cfg and returns a publisher; Start runs it.
func NewRegionPublisher(cfg PublisherConfig) (*RegionPublisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &RegionPublisher{cfg: cfg, log: cfg.Logger.With("component", "global-publisher", "region", cfg.Region)}, nil
}

// Stats returns the live counters.
func (p *RegionPublisher) Stats() *PublisherStats { return &p.stats }

// Active reports whether this publisher holds the region's lease.
func (p *RegionPublisher) Active() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.active
}

// Members is the number of (room, user) pairs online in the region as
// this publisher last published it; 0 while it is not the active one.
func (p *RegionPublisher) Members() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active {
		return 0
	}
	n := 0
	for _, users := range p.last.Members {
		n += len(users)
	}
	return n
}

// Start creates the lease bucket, listens for resync requests and runs
// the lease and cadence loops until ctx is done or Close is called.
func (p *RegionPublisher) Start(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, publisherStartTimeout)
	defer cancel()
	kv, err := ensureLeaseBucket(sctx, p.cfg.JetStream, p.cfg.LeaseBucket, p.cfg.LeaseTTL, p.cfg.Placement, 1, p.cfg.Storage)
	if err != nil {
		return err
	}
	p.lease = newLease(p.cfg.JetStream, kv, p.cfg.LeaseBucket, "publisher", p.cfg.Instance, p.cfg.LeaseTTL)
	for _, subj := range []string{bus.SyncResyncSubject(p.cfg.Region), bus.SyncResyncAllSubject} {
		sub, err := p.cfg.NATS.Subscribe(subj, func(*nats.Msg) { p.requestFull() })
		if err != nil {
			p.unsubscribe()
			return fmt.Errorf("global: publisher: subscribe %s: %w", subj, err)
		}
		p.subs = append(p.subs, sub)
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Add(2)
	go p.leaseLoop(ctx)
	go p.cadenceLoop(ctx)
	return nil
}

// Close stops the publisher and gives the lease up, so another node of
// the region takes over at once. It waits for the loops to end.
func (p *RegionPublisher) Close() {
	p.once.Do(func() {
		p.unsubscribe()
		if p.cancel != nil {
			p.cancel()
		}
		p.wg.Wait()
	})
}

func (p *RegionPublisher) unsubscribe() {
	for _, s := range p.subs {
		_ = s.Unsubscribe()
	}
}

// requestFull honours a resync request at the next cadence; fulls are
// rate limited there.
func (p *RegionPublisher) requestFull() {
	p.stats.Resyncs.Add(1)
	p.mu.Lock()
	p.fullDue = true
	p.mu.Unlock()
}

func (p *RegionPublisher) leaseLoop(ctx context.Context) {
	defer p.wg.Done()
	t := time.NewTicker(p.lease.interval())
	defer t.Stop()
	for {
		held, gen := p.lease.tick(ctx)
		p.mu.Lock()
		switch {
		case held && (!p.active || gen != p.gen):
			// A new term: aggregators need a full from this generation.
			p.active, p.gen, p.seq, p.last, p.known, p.cursor, p.fullDue = true, gen, 0, truth{}, nil, "", true
			p.term++
			p.log.Info("global: publisher active", "gen", gen)
		case !held && p.active:
			p.active = false
			p.log.Info("global: publisher lost its lease")
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			p.mu.Lock()
			p.active = false
			p.mu.Unlock()
			p.lease.release(context.WithoutCancel(ctx))
			return
		case <-t.C:
		}
	}
}

func (p *RegionPublisher) cadenceLoop(ctx context.Context) {
	defer p.wg.Done()
	if p.cfg.manual {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(p.cfg.Cadence)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.cadence(ctx)
		}
	}
}

// cadence reads what changed and sends one publication, if active.
func (p *RegionPublisher) cadence(ctx context.Context) {
	p.mu.Lock()
	if !p.active {
		p.mu.Unlock()
		return
	}
	term, last, known, cursor := p.term, p.last, p.known, p.cursor
	// Requested fulls: at most one per ResyncInterval, counted in
	// cadences so timer jitter cannot push one a whole cadence late.
	resyncEvery := max(1, int((p.cfg.ResyncInterval+p.cfg.Cadence-1)/p.cfg.Cadence))
	full := last.Members == nil || (p.fullDue && p.sinceFull+1 >= resyncEvery)
	p.mu.Unlock()

	// The maps of last are only changed by this goroutine, under p.mu, so
	// reading them meanwhile is safe; a new term replaces p.last instead.
	var rd cadenceRead
	var err error
	if last.Members == nil {
		rd, err = p.readWhole(ctx) // a new term
	} else {
		rd, err = p.readChanges(ctx, last, known, cursor)
	}
	if err != nil {
		if ctx.Err() != nil {
			return // closing
		}
		// Sending nothing is right: aggregators hold the region's last
		// state, and drop it if the truth stays unreadable.
		p.stats.ReadErrors.Add(1)
		p.log.Warn("global: cannot read the regional truth; skipping a cadence", "err", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active || p.term != term {
		return
	}
	budget := p.payloadBudget()
	p.cursor = rd.cursor
	ops := p.applyReadLocked(rd)
	var sendErr error
	if full {
		sendErr = p.sendFullLocked(budget)
	} else {
		sendErr = p.sendDeltasLocked(ops, budget)
	}
	if sendErr != nil {
		// Aggregators see the gap and ask; send a full next time anyway.
		p.stats.SendErrors.Add(1)
		p.fullDue = true
		p.log.Warn("global: publication failed", "err", sendErr)
	}
}

// payloadBudget is the bytes a publication may hold: the server's
// maximum payload less the envelope's slack.
func (p *RegionPublisher) payloadBudget() int {
	maxPayload := int(p.cfg.NATS.MaxPayload())
	if maxPayload <= 0 {
		maxPayload = 1 << 20 // not connected yet: the server default
	}
	return max(maxPayload-payloadSlack, 4096)
}

// applyReadLocked brings last to what a cadence read and returns the
// difference, which a delta carries.
func (p *RegionPublisher) applyReadLocked(rd cadenceRead) (ops []roomOps) {
	switch {
	case rd.whole && p.last.Members == nil:
		p.last, p.known = rd.view, rd.known
	case rd.whole:
		ops = rd.view.Diff(p.last)
		p.last, p.known = rd.view, rd.known
	default:
		p.known.apply(rd.known, rd.knownUsers)
		var repaired []string
		ops, repaired = rd.patch.ops(p.last)
		if len(repaired) > 0 {
			p.stats.Repairs.Add(int64(len(repaired)))
			// A change behind the scripts' back, or a departure the reads
			// already leave out that the reaper has not announced yet.
			p.log.Warn("global: the check found members the change log had not named; publishing them", "members", len(repaired), "first", repaired[0])
		}
		p.last.Members.Apply(ops)
		p.last.States.Apply(ops)
	}
	return ops
}

// sendFullLocked publishes a full: what this publisher has published,
// now brought up to date. After the first of a term it needs no read of
// the region, however many aggregators ask.
func (p *RegionPublisher) sendFullLocked(budget int) error {
	var sendErr error
	p.seq++
	parts := chunkOps(p.last.Ops(), budget)
	if len(parts) == 0 {
		parts = [][]roomOps{nil}
	}
	for i, ops := range parts {
		sendErr = errors.Join(sendErr, p.send(bus.SyncFullSubject(p.cfg.Region), publication{
			Kind: kindFull, Seq: p.seq, Part: i + 1, Parts: len(parts), Rooms: ops,
		}))
	}
	p.stats.Fulls.Add(1)
	p.fullDue, p.sinceFull, p.sinceDigest = false, 0, 0
	return sendErr
}

// sendDeltasLocked publishes ops as deltas, the last carrying the digest
// when one is due.
func (p *RegionPublisher) sendDeltasLocked(ops []roomOps, budget int) error {
	var sendErr error
	chunks := chunkOps(ops, budget)
	if len(chunks) == 0 {
		chunks = [][]roomOps{nil}
	}
	p.sinceFull++
	p.sinceDigest++
	dg := ""
	if p.sinceDigest >= p.cfg.FullEvery {
		dg, p.sinceDigest = digest(p.last.Members, p.last.States), 0
	}
	for i, ops := range chunks {
		p.seq++
		pub := publication{Kind: kindDelta, Seq: p.seq, Rooms: ops}
		if i == len(chunks)-1 {
			pub.Digest = dg
		}
		sendErr = errors.Join(sendErr, p.send(bus.SyncDeltaSubject(p.cfg.Region), pub))
		p.stats.Deltas.Add(1)
	}
	return sendErr
}

// cadenceRead is what one cadence read: the whole region (view), or the
// members that changed and a slice of rooms (patch).
type cadenceRead struct {
	whole  bool
	view   truth
	patch  patch
	cursor string // the change log's cursor after this read
	// The entries read: of whole rooms (known) and of named users
	// (knownUsers: room -> user -> entries, nil when not a member).
	known      entrySet
	knownUsers map[string]map[string][]string
}

// fullReadTimeout bounds a read of the whole region: it takes longer
// than a cadence in a large region (seconds at a million sessions), and
// happens only at the start of a term and when the change log cannot
// say what changed.
func (p *RegionPublisher) fullReadTimeout() time.Duration {
	return max(p.cfg.ReadTimeout, wholeReadCadences*p.cfg.Cadence)
}

// wholeReadCadences bounds a whole read, in cadences.
const wholeReadCadences = 10

// readWhole reads the whole region. From a ChangeSource it first takes
// the change log's cursor: what it reads is then at least as new as the
// cursor, and changes after it are read next cadence; it also learns the
// members' entries.
func (p *RegionPublisher) readWhole(ctx context.Context) (cadenceRead, error) {
	ctx, cancel := context.WithTimeout(ctx, p.fullReadTimeout())
	defer cancel()
	rd := cadenceRead{whole: true}
	p.stats.WholeReads.Add(1)
	cs, ok := p.cfg.Source.(ChangeSource)
	if !ok {
		var err error
		rd.view, err = readRegion(ctx, p.cfg.Source, p.cfg.PageSize)
		return rd, err
	}
	_, next, _, err := cs.Changes(ctx, "", 1)
	if err != nil {
		return rd, fmt.Errorf("global: read region: changes: %w", err)
	}
	rd.cursor = next
	rooms, err := cs.Rooms(ctx)
	if err != nil {
		return rd, fmt.Errorf("global: read region: rooms: %w", err)
	}
	rooms = slices.DeleteFunc(rooms, func(r string) bool { return presence.ValidateRoom(r) != nil })
	snaps, names, err := cs.Entries(ctx, rooms)
	if err != nil {
		return rd, fmt.Errorf("global: read region: %w", err)
	}
	rd.view = truth{Members: regionView{}, States: stateView{}}
	for _, snap := range snaps {
		rd.view.add(snap.Room, snap.Members)
	}
	rd.known = entriesByUser(names)
	return rd, nil
}

// readChanges reads what changed since cursor: the next slice of the
// anti-entropy check (CheckEvery), then the members the change log names.
// A source without a change log, or a log that cannot say, is read whole.
func (p *RegionPublisher) readChanges(ctx context.Context, last truth, known entrySet, cursor string) (cadenceRead, error) {
	cs, ok := p.cfg.Source.(ChangeSource)
	if !ok {
		return p.readWhole(ctx)
	}
	rctx, cancel := context.WithTimeout(ctx, p.cfg.ReadTimeout)
	defer cancel()
	// The slice before the log: a change made after the slice was read
	// is named by this read of the log, so what the slice shows and the
	// log does not name was missed by the log, not merely late.
	slice, err := p.checkSlice(rctx, cs, last)
	if err != nil {
		return cadenceRead{}, err
	}
	var rd cadenceRead
	var sliceNames map[string][]string
	if len(slice) > 0 {
		if rd.patch.rosters, sliceNames, err = cs.Entries(rctx, slice); err != nil {
			return rd, fmt.Errorf("global: read region: %w", err)
		}
	}
	changed, next, complete, err := cs.Changes(rctx, cursor, maxMarks(last))
	if err != nil {
		return cadenceRead{}, fmt.Errorf("global: read region: changes: %w", err)
	}
	if !complete {
		// The log lost track (the publisher was away longer than it
		// keeps marks, Redis lost it, a storm): read everything, once.
		rd, err := p.readWhole(ctx)
		rd.cursor = next
		return rd, err
	}
	rd.cursor = next
	// The entries the slice read are the freshest known; then each named
	// user is looked up by the entries known and those the log added.
	rd.known = entriesByUser(sliceNames)
	named, want := namedUsers(changed, rd.known, known)
	rd.patch.changed = named
	if len(want) > 0 {
		var live map[string][]string
		if rd.patch.members, live, err = cs.MembersOf(rctx, want); err != nil {
			return rd, fmt.Errorf("global: read region: %w", err)
		}
		rd.knownUsers = usersFound(named, entriesByUser(live))
	}
	return rd, nil
}

// namedUsers returns the users the change log named, by room, and the
// entries to look each up by: those the slice read (fresh), else those
// known, with those the log added; a user with none known is looked up
// by name (the store scans for their entries).
func namedUsers(changed map[string][]string, fresh, known entrySet) (named, want map[string][]string) {
	named, want = map[string][]string{}, map[string][]string{}
	for room, names := range changed {
		added := entriesByUser(map[string][]string{room: names})[room]
		seen := map[string]bool{}
		for _, n := range names {
			u, _, _ := strings.Cut(n, ":")
			if seen[u] {
				continue
			}
			seen[u] = true
			named[room] = append(named[room], u)
			cands := fresh[room][u]
			if _, ok := fresh[room]; !ok {
				cands = known[room][u]
			}
			cands = dedupeStrings(append(slices.Clone(cands), added[u]...))
			if len(cands) == 0 {
				cands = []string{u}
			}
			want[room] = append(want[room], cands...)
		}
	}
	return named, want
}

// usersFound is each named user's live entries, nil for one who is not a
// member.
func usersFound(named map[string][]string, got entrySet) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for room, users := range named {
		m := map[string][]string{}
		for _, u := range users {
			m[u] = got[room][u]
		}
		out[room] = m
	}
	return out
}

// entrySet holds the entries of the members a publisher has read:
// room -> user -> entry names, as a ChangeSource gives them (each starts
// with "user:"). It lets the publisher read a changed member by looking
// up their entries instead of scanning their room.
type entrySet map[string]map[string][]string

// entriesByUser groups entry names by the user that starts each.
func entriesByUser(names map[string][]string) entrySet {
	out := make(entrySet, len(names))
	for room, ns := range names {
		m := map[string][]string{}
		for _, n := range ns {
			if u, rest, ok := strings.Cut(n, ":"); ok && rest != "" {
				m[u] = append(m[u], n)
			}
		}
		out[room] = m
	}
	return out
}

// apply brings s up to date with a cadence's read: the rooms read whole
// replace what s had of them, then the users read replace theirs.
func (s entrySet) apply(rooms entrySet, users map[string]map[string][]string) {
	for room, m := range rooms {
		s[room] = m
	}
	for room, m := range users {
		r := s[room]
		if r == nil {
			r = map[string][]string{}
			s[room] = r
		}
		for u, es := range m {
			if len(es) == 0 {
				delete(r, u)
			} else {
				r[u] = es
			}
		}
		if len(r) == 0 {
			delete(s, room)
		}
	}
}

func dedupeStrings(ss []string) []string {
	slices.Sort(ss)
	return slices.Compact(ss)
}

// maxMarks bounds the members a change log may name before the region is
// read whole instead: past about a quarter of its sessions, reading
// member by member costs more than reading rooms whole.
func maxMarks(last truth) int {
	n := 0
	for _, users := range last.Members {
		for _, ss := range users {
			n += len(ss)
		}
	}
	return max(1000, n/4)
}

// checkSlice returns the rooms this cadence re-reads whole for the
// anti-entropy check: a pass reads the region's rooms (and those last
// published), as listed when it starts, in CheckEvery slices, one per
// cadence, so each room is compared with what was published once per
// CheckEvery cadences whatever the region's size. Only the cadence
// goroutine calls it.
func (p *RegionPublisher) checkSlice(ctx context.Context, cs ChangeSource, last truth) ([]string, error) {
	if p.passStep >= p.cfg.CheckEvery || p.pass == nil {
		rooms, err := cs.Rooms(ctx)
		if err != nil {
			return nil, fmt.Errorf("global: read region: rooms: %w", err)
		}
		set := make(map[string]struct{}, len(rooms)+len(last.Members))
		for _, r := range rooms {
			if presence.ValidateRoom(r) == nil {
				set[r] = struct{}{}
			}
		}
		for r := range last.Members {
			set[r] = struct{}{}
		}
		p.pass, p.passStep = sortedKeys(set), 0
	}
	k, n := p.passStep, len(p.pass)
	p.passStep++
	return p.pass[k*n/p.cfg.CheckEvery : (k+1)*n/p.cfg.CheckEvery], nil
}

// send fills in the envelope and publishes. p.mu is held.
func (p *RegionPublisher) send(subject string, pub publication) error {
	pub.V, pub.Region, pub.Gen, pub.Inst, pub.At = syncVersion, p.cfg.Region, p.gen, p.cfg.Instance, time.Now().UnixMilli()
	if pub.Rooms == nil {
		pub.Rooms = []roomOps{}
	}
	data, err := json.Marshal(pub)
	if err != nil {
		return err
	}
	p.stats.Bytes.Add(int64(len(data)))
	return p.cfg.NATS.Publish(subject, data)
}

// ChangeSource is a RosterSource that also keeps a log of the members that
// changed; *region.Store is one. A publisher reading a ChangeSource reads,
// each cadence, only the members the log names (plus a slice of the
// anti-entropy check), so its cost follows the region's churn, not its
// size.
type ChangeSource interface {
	RosterSource
	// Changes returns the names (room -> a user, or an entry added,
	// "user:…") changed since cursor,
	// at most most of them, and the cursor to pass next. complete is
	// false when the log cannot say ("" cursor, too old, lost, too many);
	// the caller then reads everything, after this call.
	Changes(ctx context.Context, cursor string, most int) (changed map[string][]string, next string, complete bool, err error)
	// Entries reads whole rooms as Rosters does, and also returns each
	// room's entries of its members: opaque names, each "user:…", that
	// MembersOf looks up.
	Entries(ctx context.Context, rooms []string) ([]presence.Snapshot, map[string][]string, error)
	// MembersOf reads members of each room, given by name: a user, or
	// entries of theirs (as Entries, MembersOf and Changes name them) to
	// look up. One snapshot per room lists those who are members (a
	// named user missing is not one), and each room's live entries of
	// them are returned.
	MembersOf(ctx context.Context, want map[string][]string) ([]presence.Snapshot, map[string][]string, error)
}

// RosterSource is a RegionSource that also reads whole rooms in bulk;
// *region.Store is one. readRegion prefers it: one round trip per 100
// rooms instead of one per page of each room.
type RosterSource interface {
	RegionSource
	// Rosters returns every member of each room, in the order given.
	Rosters(ctx context.Context, rooms []string) ([]presence.Snapshot, error)
}

// readRegion reads a region's truth: every room's members with their
// live session ids and those sessions' states. Members inside the
// regional offline grace (no sessions) are present with an empty list.
// Rooms (and pages of one room, from a source that is not a
// RosterSource) are read at slightly different moments; the next cadence
// corrects any skew.
func readRegion(ctx context.Context, src RegionSource, pageSize int) (truth, error) {
	rooms, err := src.Rooms(ctx)
	if err != nil {
		return truth{}, fmt.Errorf("global: read region: rooms: %w", err)
	}
	rooms = slices.DeleteFunc(rooms, func(r string) bool { return presence.ValidateRoom(r) != nil })
	t := truth{Members: regionView{}, States: stateView{}}
	if rs, ok := src.(RosterSource); ok {
		snaps, err := rs.Rosters(ctx, rooms)
		if err != nil {
			return truth{}, fmt.Errorf("global: read region: %w", err)
		}
		for _, snap := range snaps {
			t.add(snap.Room, snap.Members)
		}
		return t, nil
	}
	for _, room := range rooms {
		for off := 0; ; {
			snap, err := src.Snapshot(ctx, room, off, pageSize)
			if err != nil {
				return truth{}, fmt.Errorf("global: read region: room %s: %w", room, err)
			}
			t.add(room, snap.Members)
			off += len(snap.Members)
			if len(snap.Members) == 0 || off >= snap.Total {
				break
			}
		}
	}
	return t, nil
}

// add records members of room.
func (t truth) add(room string, members []presence.Member) {
	for _, m := range members {
		ss := make([]string, 0, len(m.Sessions))
		for _, s := range m.Sessions {
			ss = append(ss, s.ID)
			if len(s.State) > 0 {
				if t.States[room] == nil {
					t.States[room] = map[string]map[string]string{}
				}
				if t.States[room][m.User] == nil {
					t.States[room][m.User] = map[string]string{}
				}
				t.States[room][m.User][s.ID] = string(s.State)
			}
		}
		ss = normSessions(ss) // two holders' entries of one session list it once
		if t.Members[room] == nil {
			t.Members[room] = map[string][]string{}
		}
		t.Members[room][m.User] = ss
	}
}
