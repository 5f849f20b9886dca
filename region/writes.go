package region

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/presence-dev/presence/presence"
)

// Release records a clean close of one session. The user stays a member
// for the offline grace; if no session of theirs returns or is
// refreshed, a reaper announces the departure: at the grace's end, or
// when the last of their sessions held by a node goes stale (its node
// silent for Timing.Unrefreshed) if that is later. Releasing
// a session this store does not hold (unknown, or taken over by another
// holder) is a no-op.
func (s *Store) Release(ctx context.Context, ref presence.SessionRef) error {
	if err := ref.Validate(); err != nil {
		return &OpError{"release", err}
	}
	code, until, err := s.hold(ctx)
	if err != nil {
		return &OpError{"release", err}
	}
	cmds, err := s.exec(ctx, []call{{
		script: scriptRelease,
		keys:   s.roomKeys(ref.Room).writeKeys(s.indexKey(ref.Room)),
		args: []any{ms(s.opt.PublishLease), s.opt.MaxOutbox, ms(s.t.OfflineGrace), ref.Room, ref.User, ref.Session,
			code, ms(s.t.SessionTTL), ms(s.t.Unrefreshed()), s.heldInc(ref), until},
	}})
	if err != nil {
		if s.leaseEnded(err) {
			err = errNoLease
		}
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
	code, until, err := s.hold(ctx)
	if err != nil {
		return false, &OpError{"set state", err}
	}
	cmds, err := s.exec(ctx, []call{{
		script: scriptState,
		keys:   s.roomKeys(ref.Room).writeKeys(s.indexKey(ref.Room)),
		args: []any{ms(s.opt.PublishLease), s.opt.MaxOutbox, ref.Room, ref.User, ref.Session, buf.String(), code,
			s.heldInc(ref), until, s.writeFormat()},
	}})
	if err != nil {
		if s.leaseEnded(err) {
			err = errNoLease
		}
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
