package node

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/presence"
)

// flights shares the joiners' snapshot reads of each room: joiners who
// ask while a read is under way share the next one, so a join storm
// costs the store one read at a time per room, not one per joiner.
//
// Its own lock, flights.mu, guards every room's flights; the reads run
// outside it. The one promise of a flight is that it began after each of
// its joiners asked, so it includes their joins; it needs nothing of the
// rooms' state. What a snapshot serves (snapshot then events) is decided
// after the read, under hub.mu (hub.readyLocked).
type flights struct {
	store   Snapshotter
	limit   int             // snapshot members
	ctx     context.Context // bounds the reads (the node's Close cancels it)
	timeout time.Duration
	wg      *sync.WaitGroup // counts the reading goroutines
	reads   prometheus.Counter

	mu    sync.Mutex
	rooms map[string]*roomFlights
}

// roomFlights are a room's reads: the one under way and the next, for
// joiners who asked after it began.
type roomFlights struct {
	reading, queued *flight
}

// flight is one snapshot read shared by the joiners waiting for it.
type flight struct {
	done    chan struct{}
	snap    presence.Snapshot
	err     error
	waiters int // joiners that asked for it, under flights.mu
}

func newFlights(store Snapshotter, limit int, ctx context.Context, timeout time.Duration, wg *sync.WaitGroup, reads prometheus.Counter) *flights {
	return &flights{store: store, limit: limit, ctx: ctx, timeout: timeout, wg: wg, reads: reads, rooms: map[string]*roomFlights{}}
}

// read returns a snapshot of room read after the call began. A read is
// bounded by the store timeout, never by a joiner's context, so one
// joiner giving up fails no other.
func (fs *flights) read(ctx context.Context, room string) (presence.Snapshot, error) {
	fs.mu.Lock()
	rf := fs.rooms[room]
	if rf == nil {
		rf = &roomFlights{}
		fs.rooms[room] = rf
	}
	f := rf.queued
	if f == nil {
		f = &flight{done: make(chan struct{})}
		if rf.reading == nil {
			rf.reading = f
			fs.wg.Add(1)
			go fs.fly(room, rf, f)
		} else {
			rf.queued = f
		}
	}
	f.waiters++
	fs.mu.Unlock()
	select {
	case <-f.done:
		return f.snap, f.err
	case <-ctx.Done():
		return presence.Snapshot{}, ctx.Err()
	}
}

// fly reads f's snapshot, then each queued one, until none is queued;
// the room's flights are then forgotten.
func (fs *flights) fly(room string, rf *roomFlights, f *flight) {
	defer fs.wg.Done()
	for f != nil {
		ctx, cancel := context.WithTimeout(fs.ctx, fs.timeout)
		f.snap, f.err = fs.store.Snapshot(ctx, room, 0, fs.limit)
		cancel()
		fs.reads.Inc()
		close(f.done)
		fs.mu.Lock()
		f, rf.queued = rf.queued, nil
		rf.reading = f
		if f == nil {
			delete(fs.rooms, room)
		}
		fs.mu.Unlock()
	}
}

// waiting is how many joiners asked for room's reads under way or
// queued.
func (fs *flights) waiting(room string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := 0
	if rf := fs.rooms[room]; rf != nil {
		for _, f := range []*flight{rf.reading, rf.queued} {
			if f != nil {
				n += f.waiters
			}
		}
	}
	return n
}
