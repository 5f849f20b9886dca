package region

// The region's clock and this store's own view of Redis outages: both
// hold expiries after Redis was out of reach (see doc.go, Time).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// clockState is the region's clock (clock.lua) as this store last read it.
type clockState struct {
	now, cut, hold int64     // Redis ms
	at             time.Time // when it was read, by the local clock
}

// readClock reads the region's clock at the start of a sweep.
func (s *Store) readClock(ctx context.Context) (clockState, error) {
	start := time.Now()
	res, err := scriptClock.Run(ctx, s.rdb, []string{s.clockKey()}, ms(s.t.OutageGap()), ms(s.t.OutageHold())).Slice()
	if err != nil {
		s.failedCall()
		return clockState{}, err
	}
	s.answered(start)
	if len(res) != 3 {
		return clockState{}, fmt.Errorf("clock: malformed reply of %d items", len(res))
	}
	c := clockState{now: num(res[0]), cut: num(res[1]), hold: num(res[2]), at: time.Now()}
	s.stats.Sweeps.Add(1)

	s.clockMu.Lock()
	prev := s.clock
	s.clock = c
	s.clockMu.Unlock()
	if c.cut < c.now && prev.cut == prev.now {
		s.stats.OutageHolds.Add(1)
		s.log.Warn("presence: the region's Redis was out of reach; expiries of sessions alive before are held", "region", s.opt.Region,
			"outage_ms", c.now-c.cut, "hold_ms", c.hold-c.now)
	}
	return c, nil
}

// outage is this store's own view of Redis having been out of its reach:
// its calls failed or hung for OutageGap. Until its reaper reads the
// region's clock (next sweep), its writes and reads hold expiries on this
// view, so the refreshes it sends the moment Redis answers again do not
// expire the very sessions they come to refresh.
type outage struct {
	lastOK      time.Time // local time of the last call that answered
	failed      bool      // a call failed since lastOK
	from, until time.Time // local: hold what lived at from, until until
}

// answered records a call that started at start and got an answer.
func (s *Store) answered(start time.Time) {
	now := time.Now()
	s.clockMu.Lock()
	defer s.clockMu.Unlock()
	o := &s.out
	switch {
	case now.Sub(start) >= s.t.OutageGap():
		o.from, o.until = start, now.Add(s.t.OutageHold())
	case o.failed && !o.lastOK.IsZero() && now.Sub(o.lastOK) >= s.t.OutageGap():
		o.from, o.until = o.lastOK, now.Add(s.t.OutageHold())
	}
	o.lastOK, o.failed = now, false
}

// failedCall records a call that got no answer.
func (s *Store) failedCall() {
	s.clockMu.Lock()
	s.out.failed = true
	s.clockMu.Unlock()
}

// exec runs calls, noting whether Redis answered (see outage).
func (s *Store) exec(ctx context.Context, calls []call) ([]*redis.Cmd, error) {
	start := time.Now()
	cmds, err := runAll(ctx, s.rdb, calls)
	if err != nil && !isScriptError(err) {
		s.failedCall()
	} else {
		s.answered(start)
	}
	return cmds, err
}

// isScriptError reports whether err is an error reply of Redis (it
// answered) rather than a failure to reach it.
func isScriptError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && err != context.DeadlineExceeded
}

// redisMS estimates Redis's clock at local time t from the last clock
// read; 0 if there was none.
func (s *Store) redisMS(t time.Time) int64 {
	c := s.clock
	if c.at.IsZero() {
		return 0
	}
	return c.now + t.Sub(c.at).Milliseconds()
}

// readCut is the cut of reads (see read_cut in lib.lua): while the
// region holds expiries after an outage, or this store has just seen one
// itself, the moment it began; else 0.
func (s *Store) readCut() int64 {
	s.clockMu.Lock()
	defer s.clockMu.Unlock()
	now := time.Now()
	var cut int64
	if c := s.clock; !c.at.IsZero() && c.cut < c.now && s.redisMS(now) < c.hold {
		cut = c.cut
	}
	if o := s.out; now.Before(o.until) {
		if from := s.redisMS(o.from); from > 0 && (cut == 0 || from < cut) {
			cut = from
		}
	}
	return cut
}

// localHold is this store's own view of an outage (see outage) in Redis
// time: what lived at cut is held until hold; 0 when none.
func (s *Store) localHold() (cut, hold int64) {
	s.clockMu.Lock()
	defer s.clockMu.Unlock()
	if o := s.out; time.Now().Before(o.until) {
		return s.redisMS(o.from), s.redisMS(o.until)
	}
	return 0, 0
}

// readSlack is how long past its expiry a user stays a member for reads
// until a reaper announces the departure (see read_cut in lib.lua): two
// reap intervals and half a second, the reaper's usual lag.
func (s *Store) readSlack() time.Duration { return 2*s.t.ReapInterval + 500*time.Millisecond }
