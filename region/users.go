package region

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/presence-dev/presence/presence"
)

// MaxUsersRead bounds the users of one Users read.
const MaxUsersRead = 1000

// Users returns the presence of the given users in a room, as a snapshot
// holding only those of them who are members (in the order given; Total
// counts them), with the sequences that join it to the room's event
// stream: a watch list's first read. The cost follows the list, not the
// room.
func (s *Store) Users(ctx context.Context, room string, users []string) (presence.Snapshot, error) {
	snap := presence.Snapshot{Region: s.opt.Region, Room: room}
	if err := presence.ValidateRoom(room); err != nil {
		return snap, &OpError{"users", err}
	}
	if len(users) > MaxUsersRead {
		return snap, &OpError{"users", fmt.Errorf("%d users, at most %d", len(users), MaxUsersRead)}
	}
	args := make([]any, 0, 2+len(users))
	args = append(args, s.readCut(), ms(s.readSlack()))
	for _, u := range users {
		if err := presence.ValidateUser(u); err != nil {
			return snap, &OpError{"users", err}
		}
		args = append(args, u)
	}
	res, err := scriptUsers.Run(ctx, s.rdb, s.roomKeys(room).snapshotKeys(), args...).Slice()
	if err != nil {
		return snap, &OpError{"users", err}
	}
	if len(res) < 5 {
		return snap, &OpError{"users", fmt.Errorf("short reply of %d items", len(res))}
	}
	decodeSnapshot(&snap, res)
	for _, m := range snap.Members {
		slices.SortFunc(m.Sessions, func(a, b presence.SessionInfo) int { return cmp.Compare(a.ID, b.ID) })
	}
	return snap, nil
}
