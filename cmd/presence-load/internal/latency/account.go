// Package latency is the node's edge measured one connection at a time:
// idle (RSS and CPU per session), latency and sweep (join -> online on
// NATS and on a watcher's WebSocket, every join accounted for by the
// ledger), storm (joins at once into a large room) and the CPU hog.
package latency

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// maxAttempts bounds the sends of one join when the node keeps refusing
// it with a retry_after_ms.
const maxAttempts = 10

// joinRecord follows one measured join. Each is a user's first session in
// its room, so each produces exactly one online event.
type joinRecord struct {
	user, room string
	sent       time.Time // first send: every latency is measured from it
	attempts   int
	replyAt    time.Time // the join's snapshot reply (any attempt)
	refusals   int       // error frames answering this join
	lastCode   string
	// final: refused with no retry to come (no retry_after_ms, attempts
	// used up, or the run over). No online is expected for it.
	final        bool
	retryPending bool
	natsAt, wsAt time.Time
	// resynced: the room's watcher got a resync snapshot listing the user
	// before it saw the user's online event; the event will never come.
	resynced    bool
	watcherLost bool // the room's watcher connection ended before the event
}

// ledger is the accounting of one latency run (one sweep step): every
// join, every frame the watchers read, every event the NATS subscriber
// saw. It does no I/O, so it is tested on synthetic frames.
type ledger struct {
	mu     sync.Mutex
	byUser map[string]*joinRecord
	order  []*joinRecord

	resyncSnapshots int // resync snapshots received by watchers
	wsDuplicates    int // online events for a user already seen or resynced on the watcher (a protocol violation)
	natsDuplicates  int // onlines redelivered on core NATS (allowed: a retried publish)
	badFrames       int // frames that did not parse
	watchersLost    map[string]string
	joinersLost     int
	errorFrames     map[string]int // error codes received by watchers or unmatched refs
	offlines        int            // offline events of this run's users (joiners and watchers) on NATS
}

func newLedger() *ledger {
	return &ledger{byUser: map[string]*joinRecord{}, watchersLost: map[string]string{}, errorFrames: map[string]int{}}
}

// add registers a join before it is first sent.
func (l *ledger) add(user, room string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := &joinRecord{user: user, room: room}
	l.byUser[user] = r
	l.order = append(l.order, r)
}

// send records an attempt and returns its number (1 for the first send).
// Latencies count from the first.
func (l *ledger) send(user string, at time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.byUser[user]
	if r.attempts == 0 {
		r.sent = at
	}
	r.attempts++
	r.retryPending = false
	return r.attempts
}

// isEvent tells an event frame from its first bytes: the node writes
// "type" first. A frame not recognised here is parsed in full.
func isEvent(data []byte) bool { return bytes.HasPrefix(data, []byte(`{"type":"event"`)) }

// joinerFrame handles a frame read by the joiner's own connection. Events
// of other joiners in the room are skipped; the join's snapshot reply and
// error frames are recorded. It returns the delay before a retry when the
// node refused the join with a retry_after_ms (and attempts are left),
// else 0; the caller then either sends the join again or calls
// retryDropped.
func (l *ledger) joinerFrame(user string, data []byte, at time.Time) time.Duration {
	if isEvent(data) {
		return 0
	}
	var f protocol.Frame
	if err := json.Unmarshal(data, &f); err != nil {
		l.mu.Lock()
		l.badFrames++
		l.mu.Unlock()
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.byUser[user]
	if r == nil || !strings.HasPrefix(f.Ref, "j") {
		if f.Type == "error" {
			l.errorFrames[string(f.Code)]++
		}
		return 0
	}
	switch f.Type {
	case "snapshot":
		if r.replyAt.IsZero() {
			r.replyAt = at
		}
		r.final = false
	case "error":
		r.refusals++
		r.lastCode = string(f.Code)
		if f.RetryAfterMS > 0 && r.attempts < maxAttempts {
			r.retryPending = true
			return time.Duration(f.RetryAfterMS) * time.Millisecond
		}
		if r.replyAt.IsZero() {
			r.final = true
		}
	}
	return 0
}

// retryDropped marks a scheduled retry that was not sent (the run ended).
func (l *ledger) retryDropped(user string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.byUser[user]; r != nil && r.retryPending {
		r.retryPending = false
		if r.replyAt.IsZero() {
			r.final = true
		}
	}
}

// joinerLost records a joiner connection that ended during the run.
func (l *ledger) joinerLost() {
	l.mu.Lock()
	l.joinersLost++
	l.mu.Unlock()
}

// natsEvent records an event seen by the NATS subscriber.
func (l *ledger) natsEvent(kind presence.Kind, user string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch kind {
	case presence.Offline:
		l.offlines++
	case presence.Online:
		r := l.byUser[user]
		if r == nil {
			return // a watcher
		}
		if !r.natsAt.IsZero() {
			l.natsDuplicates++
			return
		}
		r.natsAt = at
	}
}

// watcherFrame handles a frame read by the watcher of room. An online
// event for a joiner of the room is its arrival on the WebSocket path. A
// resync snapshot replaces the events it covers: a joiner it lists whose
// online the watcher has not seen will never get it as an event.
func (l *ledger) watcherFrame(room string, data []byte, at time.Time) {
	var f protocol.Frame
	if err := json.Unmarshal(data, &f); err != nil {
		l.mu.Lock()
		l.badFrames++
		l.mu.Unlock()
		return
	}
	var ev presence.Transition
	if f.Type == "event" {
		var err error
		if ev, err = bus.DecodeEvent(f.Event); err != nil {
			l.mu.Lock()
			l.badFrames++
			l.mu.Unlock()
			return
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch f.Type {
	case "event":
		if ev.Kind != presence.Online || ev.Room != room {
			return
		}
		r := l.byUser[ev.User]
		if r == nil || r.room != room {
			return
		}
		if !r.wsAt.IsZero() || r.resynced {
			l.wsDuplicates++
			return
		}
		r.wsAt = at
	case "snapshot":
		if f.Reason != "resync" || f.Snapshot == nil {
			return
		}
		l.resyncSnapshots++
		for _, m := range f.Snapshot.Members {
			if r := l.byUser[m.User]; r != nil && r.room == room && !r.sent.IsZero() && r.wsAt.IsZero() {
				r.resynced = true
			}
		}
	case "error":
		l.errorFrames[string(f.Code)]++
	}
}

// watcherGone records that room's watcher connection ended during the
// run: joins of the room it has not seen can no longer arrive on it.
func (l *ledger) watcherGone(room, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watchersLost[room] = why
	l.unwatchedLocked(room)
}

// noWatcher records that room has no watcher (its connection failed to
// open): its joins cannot arrive on the WebSocket path.
func (l *ledger) noWatcher(room string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unwatchedLocked(room)
}

func (l *ledger) unwatchedLocked(room string) {
	for _, r := range l.order {
		if r.room == room && r.wsAt.IsZero() && !r.resynced {
			r.watcherLost = true
		}
	}
}

// settled reports whether every sent join has its outcome on both paths,
// so waiting for stragglers can stop early.
func (l *ledger) settled() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.order {
		if r.sent.IsZero() {
			continue
		}
		if r.retryPending || (r.replyAt.IsZero() && !r.final) {
			return false
		}
		if r.final && r.natsAt.IsZero() {
			continue
		}
		if r.natsAt.IsZero() || (r.wsAt.IsZero() && !r.resynced && !r.watcherLost) {
			return false
		}
	}
	return true
}

// pending counts the sent joins still waiting for an outcome: their
// reply, their online on each path.
func (l *ledger) pending() (reply, nats, ws int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.order {
		if r.sent.IsZero() || r.final || r.retryPending {
			continue
		}
		if r.replyAt.IsZero() {
			reply++
		}
		if r.natsAt.IsZero() {
			nats++
		}
		if r.wsAt.IsZero() && !r.resynced && !r.watcherLost {
			ws++
		}
	}
	return reply, nats, ws
}

// offlineCount returns how many offline events of the run's users the
// NATS subscriber has seen.
func (l *ledger) offlineCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.offlines
}

// pathStats is one path's view of the run. lat holds one entry per join
// that was expected to produce an online on the path, sorted; joins never
// seen there are `never`.
type pathStats struct {
	lat      []time.Duration
	seen     int
	late     int // seen, but later than the late bound
	missing  int // never seen (and not replaced by a resync)
	resynced int // WebSocket path only: replaced by a resync snapshot
}

func (p pathStats) expected() int { return len(p.lat) }

func (p pathStats) q(q float64) time.Duration { return measure.Percentile(p.lat, q) }

// summary is the outcome of a run.
type summary struct {
	joins, sent, replied, unanswered int
	refusedFinal, refusedThenServed  int // joins refused for good; joins refused at least once, then answered
	refusalCodes                     map[string]int
	nats, ws, reply                  pathStats
	resyncSnapshots                  int
	wsDuplicates, natsDuplicates     int
	badFrames                        int
	watchersLost, joinersLost        int
	watcherLoss                      map[string]int // how watchers were lost: close code or error
	errorFrames                      map[string]int
}

// summarize builds the summary; late is the bound above which a seen
// event counts as late (it still enters the percentiles).
func (l *ledger) summarize(late time.Duration) summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := summary{joins: len(l.order), refusalCodes: map[string]int{}, errorFrames: map[string]int{},
		resyncSnapshots: l.resyncSnapshots, wsDuplicates: l.wsDuplicates, natsDuplicates: l.natsDuplicates,
		badFrames: l.badFrames, watchersLost: len(l.watchersLost), joinersLost: l.joinersLost}
	for k, v := range l.errorFrames {
		s.errorFrames[k] = v
	}
	s.watcherLoss = map[string]int{}
	for _, why := range l.watchersLost {
		s.watcherLoss[why]++
	}
	seen := func(p *pathStats, at, from time.Time) {
		d := at.Sub(from)
		p.lat = append(p.lat, d)
		p.seen++
		if d > late {
			p.late++
		}
	}
	for _, r := range l.order {
		if r.sent.IsZero() {
			continue
		}
		s.sent++
		if r.refusals > 0 {
			s.refusalCodes[r.lastCode]++
		}
		switch {
		case !r.replyAt.IsZero():
			s.replied++
			if r.refusals > 0 {
				s.refusedThenServed++
			}
			seen(&s.reply, r.replyAt, r.sent)
		case r.final || r.retryPending:
			s.refusedFinal++
		default:
			s.unanswered++
		}
		refused := r.replyAt.IsZero() && (r.final || r.retryPending)
		// NATS path. A refused join expects no online, but one that
		// shows up anyway is measured.
		switch {
		case !r.natsAt.IsZero():
			seen(&s.nats, r.natsAt, r.sent)
		case refused:
		default:
			s.nats.lat = append(s.nats.lat, measure.Never)
			s.nats.missing++
		}
		// WebSocket path.
		switch {
		case !r.wsAt.IsZero():
			seen(&s.ws, r.wsAt, r.sent)
		case r.resynced:
			s.ws.lat = append(s.ws.lat, measure.Never)
			s.ws.resynced++
		case refused && r.natsAt.IsZero():
		default:
			s.ws.lat = append(s.ws.lat, measure.Never)
			s.ws.missing++
		}
	}
	for _, p := range []*pathStats{&s.nats, &s.ws, &s.reply} {
		slices.Sort(p.lat)
	}
	return s
}

// failures lists what makes the run fail: an online that never arrived
// on a path, a resync that replaced events, joins refused for good, joins
// never sent or never answered, watchers lost.
func (s summary) failures() []string {
	var f []string
	if n := s.joins - s.sent; n > 0 {
		f = append(f, fmt.Sprintf("%d joins never sent", n))
	}
	if s.nats.missing > 0 {
		f = append(f, fmt.Sprintf("%d online events missing on NATS", s.nats.missing))
	}
	if s.ws.missing > 0 {
		f = append(f, fmt.Sprintf("%d online events missing on the WebSocket path", s.ws.missing))
	}
	if s.ws.resynced > 0 {
		f = append(f, fmt.Sprintf("%d online events replaced by %d resync snapshots on the WebSocket path", s.ws.resynced, s.resyncSnapshots))
	}
	if s.refusedFinal > 0 {
		f = append(f, fmt.Sprintf("%d joins refused by the node (%s)", s.refusedFinal, measure.Codes(s.refusalCodes)))
	}
	if s.unanswered > 0 {
		f = append(f, fmt.Sprintf("%d joins never answered", s.unanswered))
	}
	if s.watchersLost > 0 {
		f = append(f, fmt.Sprintf("%d watcher connections lost", s.watchersLost))
	}
	if s.wsDuplicates > 0 {
		f = append(f, fmt.Sprintf("%d duplicate online events on the WebSocket path", s.wsDuplicates))
	}
	return f
}
