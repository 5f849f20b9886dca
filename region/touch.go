package region

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/presence"
)

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

// touch is Claim (claim) or Refresh: validate, sort, batch into script
// calls, run them in one round trip, then read the replies.
func (s *Store) touch(ctx context.Context, op string, refs []presence.SessionRef) (presence.TouchResult, error) {
	var res presence.TouchResult
	if err := s.checkBatch(refs); err != nil {
		return res, &OpError{op, err}
	}
	code, until, err := s.hold(ctx)
	if err != nil {
		return res, &OpError{op, err}
	}
	sorted := sortRefs(refs)
	now := time.Now()
	calls := s.touchCalls(sorted, op == "claim", code, until, s.moveFormat(op == "claim", now))
	plain := make([]call, len(calls))
	for i, c := range calls {
		plain[i] = c.call
	}
	cmds, err := s.exec(ctx, plain)
	if err != nil {
		s.keepMoving(now)
		if s.leaseEnded(err) {
			err = errNoLease
		}
		return res, &OpError{op, err}
	}
	s.stats.Touched.Add(int64(len(refs)))
	pending := s.touchReplies(calls, cmds, &res)
	s.noteHeld(refs, res.Lost)
	res.Transitions = s.deliver(ctx, pending)
	s.noteActivity(ctx, unannounced(refs, res.Transitions))
	return res, nil
}

// unannounced drops the refs of users whose online or offline ts holds:
// their delivery writes their last seen (departuresSeen), so this call
// does not, and the claims queued behind it wait one round trip less.
func unannounced(refs []presence.SessionRef, ts []presence.Transition) []presence.SessionRef {
	if len(ts) == 0 {
		return refs
	}
	announced := map[string]bool{}
	for _, t := range ts {
		if t.Kind == presence.Online || t.Kind == presence.Offline {
			announced[t.User] = true
		}
	}
	if len(announced) == 0 {
		return refs
	}
	return slices.DeleteFunc(slices.Clone(refs), func(r presence.SessionRef) bool { return announced[r.User] })
}

// checkBatch rejects an empty or oversized batch, or one with an invalid
// ref, before anything is written.
func (s *Store) checkBatch(refs []presence.SessionRef) error {
	if len(refs) == 0 {
		return ErrEmptyBatch
	}
	if len(refs) > s.opt.MaxBatch {
		return fmt.Errorf("%w: %d sessions, at most %d", ErrBatchTooLarge, len(refs), s.opt.MaxBatch)
	}
	for i, r := range refs {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("session %d of %d: %w", i+1, len(refs), err)
		}
	}
	return nil
}

// sortRefs sorts a copy by room then user: each room's pairs are one run,
// and a user's sessions are adjacent, as touch.lua expects.
func sortRefs(refs []presence.SessionRef) []presence.SessionRef {
	sorted := slices.Clone(refs)
	slices.SortStableFunc(sorted, func(a, b presence.SessionRef) int {
		return cmp.Or(strings.Compare(a.Room, b.Room), strings.Compare(a.User, b.User))
	})
	return sorted
}

// roomBatch is one room's (user, session) pairs of a touch.
type roomBatch struct {
	room  string
	pairs []any
}

// byRoom splits sorted refs into one batch per room.
func byRoom(sorted []presence.SessionRef) []roomBatch {
	var rooms []roomBatch
	for _, r := range sorted {
		if len(rooms) == 0 || rooms[len(rooms)-1].room != r.Room {
			rooms = append(rooms, roomBatch{room: r.Room})
		}
		last := &rooms[len(rooms)-1]
		last.pairs = append(last.pairs, r.User, r.Session)
	}
	return rooms
}

// touchCall is one touch.lua call and its rooms, in script order.
type touchCall struct {
	call
	index string
	rooms []string
}

// touchCalls groups the rooms by reap index (one per slot on a cluster)
// and cuts each group into calls of at most ChunkSize sessions, written
// under code while its lease runs (until, Redis ms), moving the states
// they write to format move (0: none; moveFormat).
func (s *Store) touchCalls(sorted []presence.SessionRef, claim bool, code string, until, move int64) []touchCall {
	rooms := byRoom(sorted)
	byIndex := map[string][]roomBatch{}
	var order []string
	for _, rb := range rooms {
		k := s.indexKey(rb.room)
		if _, ok := byIndex[k]; !ok {
			order = append(order, k)
		}
		byIndex[k] = append(byIndex[k], rb)
	}
	flag := "0"
	if claim {
		flag = "1"
	}
	expected := s.expectedIncs(sorted)
	var calls []touchCall
	for _, k := range order {
		head := touchHead{ms(s.t.SessionTTL), ms(s.opt.PublishLease), s.opt.MaxOutbox, code, flag, expected[k], s.readCut(), ms(s.readSlack()), len(s.opt.Prefix), until, ms(s.t.Unrefreshed()), move}
		b := touchBatcher{s: s, index: k, chunk: s.opt.ChunkSize, head: head[:]}
		b.reset()
		for _, rb := range byIndex[k] {
			b.add(rb)
		}
		b.flush()
		calls = append(calls, b.out...)
	}
	return calls
}

// touchHead is touch.lua's arguments before the rooms (ARGV[1..12]).
type touchHead [12]any

// touchBatcher fills the touch calls of one reap index (see touch.lua for
// the argument layout).
type touchBatcher struct {
	s     *Store
	index string
	chunk int
	head  []any // the arguments before the rooms
	cur   touchCall
	n     int // sessions in cur
	out   []touchCall
}

func (b *touchBatcher) reset() {
	b.cur = touchCall{call: call{script: scriptTouch, keys: newTouchKeys(b.index), args: slices.Clone(b.head)}, index: b.index}
	b.n = 0
}

// add appends a room's pairs, spilling into new calls at the chunk size.
func (b *touchBatcher) add(rb roomBatch) {
	keys := b.s.roomKeys(rb.room)
	for pairs := rb.pairs; len(pairs) > 0; {
		take := min(len(pairs)/2, b.chunk-b.n)
		b.cur.keys = touchKeys(b.cur.keys).add(keys)
		b.cur.args = append(b.cur.args, take)
		b.cur.args = append(b.cur.args, pairs[:2*take]...)
		b.cur.rooms = append(b.cur.rooms, rb.room)
		pairs = pairs[2*take:]
		if b.n += take; b.n >= b.chunk {
			b.flush()
		}
	}
}

// flush ends the current call, if it has rooms.
func (b *touchBatcher) flush() {
	if len(b.cur.rooms) > 0 {
		b.out = append(b.out, b.cur)
	}
	b.reset()
}

// touchReplies reads the replies of touch.lua (see there): the slot's
// incarnation, then for each room something happened in, its position
// and the new outbox entries, the refs lost, the refs taken and the refs
// orphaned. It returns the entries by room.
func (s *Store) touchReplies(calls []touchCall, cmds []*redis.Cmd, res *presence.TouchResult) map[string][]string {
	pending := map[string][]string{}
	for ci, cmd := range cmds {
		out, _ := cmd.Slice()
		if len(out) == 0 {
			continue
		}
		s.sawIncarnation(calls[ci].index, str(out[0]))
		for i := 1; i+1 < len(out); i += 2 {
			ri := int(num(out[i])) - 1
			parts, ok := out[i+1].([]any)
			if !ok || ri < 0 || ri >= len(calls[ci].rooms) || len(parts) != 4 {
				continue
			}
			room := calls[ci].rooms[ri]
			if entries, ok := parts[0].([]any); ok && len(entries) > 0 {
				pending[room] = append(pending[room], toStrings(entries)...)
			}
			res.Lost = appendRefs(res.Lost, room, parts[1])
			res.Taken = appendRefs(res.Taken, room, parts[2])
			res.Orphaned = appendRefs(res.Orphaned, room, parts[3])
		}
	}
	return pending
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
