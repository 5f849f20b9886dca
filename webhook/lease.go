package webhook

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// leases are this dispatcher's claims on lanes, one KV key each with a
// per-key TTL: the holder creates it and refreshes it every TTL/4,
// compare-and-set on its revision. A holder that cannot refresh stops a
// quarter TTL before the key can expire, so two holders never deliver a
// lane at once on a common clock. Each dispatcher also refreshes a
// member key, and holds at most its fair share of the lanes (all lanes
// over the members, rounded up): the rest stay free for the others.
// Used by the dispatcher's lease goroutine only.
type leases struct {
	st   *state
	id   string
	ttl  time.Duration
	held map[LaneID]*lease
	lg   *slog.Logger
	// failures counts takes that failed other than on a lease held by
	// another, for the log.
	failures int
}

type lease struct {
	rev   uint64
	until time.Time // act as holder until then without a refresh
}

func newLeases(st *state, id string, ttl time.Duration, lg *slog.Logger) *leases {
	return &leases{st: st, id: id, ttl: ttl, held: map[LaneID]*lease{}, lg: lg}
}

func (ls *leases) subject(key string) string { return "$KV." + StateBucket + "." + key }

// members refreshes this dispatcher's member key and counts the
// dispatchers alive (at least this one).
func (ls *leases) members(ctx context.Context) int {
	n := 0
	_ = ls.st.do(ctx, func(kv jetstream.KeyValue) error {
		if _, err := ls.st.js.PublishMsg(ctx, &nats.Msg{Subject: ls.subject("member." + ls.id), Data: []byte(ls.id)},
			jetstream.WithMsgTTL(ls.ttl)); err != nil {
			return err
		}
		keys, err := kv.ListKeysFiltered(ctx, "member.*")
		if err != nil {
			return err
		}
		n = 0
		for range keys.Keys() {
			n++
		}
		return nil
	})
	return max(n, 1)
}

// share is how many of n lanes one of m dispatchers takes.
func share(n, m int) int { return int(math.Ceil(float64(n) / float64(max(m, 1)))) }

// refresh keeps a held lease; false once it is lost (another holds it,
// it expired, or it could not be refreshed in time). A refresh stored
// whose reply was lost (a timeout) moved the key's revision on: the
// next one fails its revision check although the key still names this
// dispatcher, so the key is read, and its revision adopted if it does.
// No refresh is waited for past the lease's until (NATS gone): from then
// on the key may expire and another take it, so the lease is lost then,
// judged by the clock after the wait, not when the refresh began.
func (ls *leases) refresh(ctx context.Context, l LaneID, now time.Time) bool {
	h := ls.held[l]
	if h == nil {
		return false
	}
	ctx, cancel := context.WithDeadline(ctx, h.until)
	defer cancel()
	err := ls.put(ctx, l, h, now)
	if wrongRevision(err) && ls.adopt(ctx, l, h) {
		err = ls.put(ctx, l, h, now)
	}
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
	case errors.As(err, &apiErr), !time.Now().Before(h.until):
		delete(ls.held, l)
		return false
	}
	return true
}

// put refreshes the lease key at h's revision.
func (ls *leases) put(ctx context.Context, l LaneID, h *lease, now time.Time) error {
	ack, err := ls.st.js.PublishMsg(ctx, &nats.Msg{Subject: ls.subject(laneKey("lease", l)), Data: []byte(ls.id)},
		jetstream.WithExpectLastSequencePerSubject(h.rev), jetstream.WithMsgTTL(ls.ttl))
	if err == nil {
		h.rev, h.until = ack.Sequence, now.Add(ls.ttl-ls.ttl/4)
	}
	return err
}

// adopt reads the lease key: if it still names this dispatcher, h takes
// its revision (its until stays: only a refresh stored now moves it).
func (ls *leases) adopt(ctx context.Context, l LaneID, h *lease) bool {
	var e jetstream.KeyValueEntry
	err := ls.st.do(ctx, func(kv jetstream.KeyValue) error {
		var err error
		e, err = kv.Get(ctx, laneKey("lease", l))
		return err
	})
	if err != nil || string(e.Value()) != ls.id {
		return false
	}
	h.rev = e.Revision()
	return true
}

func wrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// acquire takes a free lane.
func (ls *leases) acquire(ctx context.Context, l LaneID, now time.Time) bool {
	var rev uint64
	err := ls.st.do(ctx, func(kv jetstream.KeyValue) error {
		var err error
		rev, err = kv.Create(ctx, laneKey("lease", l), []byte(ls.id), jetstream.KeyTTL(ls.ttl))
		return err
	})
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			ls.failures++
			if ls.failures%20 == 1 {
				ls.lg.Warn("webhook: cannot take a lane's lease", "lane", l.String(), "err", err, "failures", ls.failures)
			}
		}
		return false
	}
	ls.failures = 0
	ls.held[l] = &lease{rev: rev, until: now.Add(ls.ttl - ls.ttl/4)}
	return true
}

// release gives a lane up, so another dispatcher takes it at its next
// tick rather than after the TTL.
func (ls *leases) release(ctx context.Context, l LaneID) {
	h := ls.held[l]
	if h == nil {
		return
	}
	delete(ls.held, l)
	_ = ls.st.do(ctx, func(kv jetstream.KeyValue) error {
		return kv.Delete(ctx, laneKey("lease", l), jetstream.LastRevision(h.rev))
	})
}

// leave gives every lane up and removes the member key.
func (ls *leases) leave(ctx context.Context) {
	for l := range ls.held {
		ls.release(ctx, l)
	}
	_ = ls.st.do(ctx, func(kv jetstream.KeyValue) error { return kv.Delete(ctx, "member."+ls.id) })
}
