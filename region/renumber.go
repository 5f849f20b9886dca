package region

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// FlooredSink is a Sink that stores into a stream which can be lost and
// made again (a JetStream stream whose store was lost). EpochFloor is the
// creation time of the stream Publish stores into, unix ms, or 0 for no
// floor. A room whose numbering began before it starts a new epoch, its
// waiting events numbered again from 1, before they are handed to
// Publish: readers of the new stream find every room's first transition
// in it of a new epoch, which tells them to take a fresh snapshot.
type FlooredSink interface {
	Sink
	EpochFloor(ctx context.Context) (int64, error)
}

// entryEpoch reads the epoch field of an outbox entry; -1 if malformed.
func entryEpoch(e string) int64 {
	_, rest, ok := strings.Cut(e, "|")
	if !ok {
		return -1
	}
	f, _, _ := strings.Cut(rest, "|")
	n, err := strconv.ParseInt(f, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// below reports whether an entry is of an epoch under floor.
func below(floor int64, entries []string) bool {
	for _, e := range entries {
		if ep := entryEpoch(e); ep >= 0 && ep < floor {
			return true
		}
	}
	return false
}

// belowFloor reports whether the sink's floor, read again, is above an
// entry's epoch: the sink found its stream gone and made it again.
func (s *Store) belowFloor(ctx context.Context, entries []string) bool {
	fs, ok := s.opt.Sink.(FlooredSink)
	if !ok {
		return false
	}
	floor, err := fs.EpochFloor(ctx)
	return err == nil && below(floor, entries)
}

// aboveFloor returns entries as they may be delivered: when the sink's
// stream is younger than the room's numbering, the room is renumbered
// (renumber.lua) and the same number of its waiting entries, renumbered,
// is returned instead. A sink without a floor changes nothing.
func (s *Store) aboveFloor(ctx context.Context, room string, entries []string) ([]string, error) {
	fs, ok := s.opt.Sink.(FlooredSink)
	if !ok || len(entries) == 0 {
		return entries, nil
	}
	floor, err := fs.EpochFloor(ctx)
	if err != nil {
		return nil, fmt.Errorf("epoch floor: %w", err)
	}
	if !below(floor, entries) {
		return entries, nil
	}
	out, err := scriptRenumber.Run(ctx, s.rdb, s.roomKeys(room).all(), floor, len(entries)).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("renumber room %s: %w", room, err)
	}
	s.log.Warn("presence: the stream is younger than the room's numbering; the room starts a new epoch",
		"room", room, "floor", floor, "events", len(out))
	return out, nil
}
