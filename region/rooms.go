package region

import (
	"context"
	"fmt"

	"github.com/presence-dev/presence/presence"
)

// MaxCountsRead bounds the rooms of one Counts read.
const MaxCountsRead = 1000

// Counts returns the number of live members of each room, in the order
// given, in one round trip (one per master on a cluster).
func (s *Store) Counts(ctx context.Context, rooms []string) ([]int, error) {
	if len(rooms) > MaxCountsRead {
		return nil, &OpError{"counts", fmt.Errorf("%d rooms, at most %d", len(rooms), MaxCountsRead)}
	}
	calls := make([]call, len(rooms))
	cut, slack := s.readCut(), ms(s.readSlack())
	for i, room := range rooms {
		if err := presence.ValidateRoom(room); err != nil {
			return nil, &OpError{"counts", err}
		}
		calls[i] = call{script: scriptCount, keys: s.roomKeys(room).countKeys(), args: []any{cut, slack}}
	}
	if len(calls) == 0 {
		return []int{}, nil
	}
	cmds, err := runAll(ctx, s.rdb, calls)
	if err != nil {
		return nil, &OpError{"counts", err}
	}
	out := make([]int, len(cmds))
	for i, c := range cmds {
		n, err := c.Int()
		if err != nil {
			return nil, &OpError{"counts", fmt.Errorf("room %q: %w", rooms[i], err)}
		}
		out[i] = n
	}
	return out, nil
}

// ListRooms returns one page of the region's rooms that have members,
// ordered by room id, with their counts: the rooms whose id starts with
// prefix and sorts after the cursor after (both may be empty), at most
// limit of them. next is the cursor of the following page, empty on the
// last one.
//
// The rooms are the reap indexes' (Rooms), so a page costs a read of
// every room name of the region, then one count per room on the page:
// an operator's or a console's listing, not a per-request path. Rooms
// the index holds without members (a grace just ended, events not yet
// delivered) are left off, so a page may hold fewer than limit rooms
// while next is not empty.
func (s *Store) ListRooms(ctx context.Context, prefix, after string, limit int) (rooms []presence.RoomCount, next string, err error) {
	if limit <= 0 || limit > MaxCountsRead {
		return nil, "", &OpError{"list rooms", fmt.Errorf("limit must be between 1 and %d, got %d", MaxCountsRead, limit)}
	}
	all, err := s.Rooms(ctx)
	if err != nil {
		return nil, "", &OpError{"list rooms", err}
	}
	page, more := presence.PageOfRooms(all, prefix, after, limit)
	counts, err := s.Counts(ctx, page)
	if err != nil {
		return nil, "", &OpError{"list rooms", err}
	}
	rooms = make([]presence.RoomCount, 0, len(page))
	for i, room := range page {
		if counts[i] > 0 {
			rooms = append(rooms, presence.RoomCount{Room: room, Count: counts[i]})
		}
	}
	if more {
		next = page[len(page)-1]
	}
	return rooms, next, nil
}
