package region

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/presence-dev/presence/presence"
)

// An outbox entry is one transition as emit in lib.lua writes it to a
// room's outbox list: nine '|'-separated fields, the state JSON (which may
// contain '|') last. Ids cannot contain '|'.
//
//	seq|epoch|kind|reason|user|sessions|at|session|state
//
// seq and epoch number the room's events (see transitionID), at is Redis
// ms, session and state are empty except on a state update. decodeEntry
// is the one reader on the Go side; entry_at in lib.lua reads at to find
// stale entries. TestOutboxEntryGolden runs the Lua against redis-server
// and fails if the two part ways.
const (
	fieldSeq = iota
	fieldEpoch
	fieldKind
	fieldReason
	fieldUser
	fieldSessions
	fieldAt
	fieldSession
	fieldState
	entryFields
)

// transitionID is the event id of a room's transition: unique per
// region, room, epoch and seq, and the same on every redelivery, so the
// bus deduplicates it.
func transitionID(region, room string, epoch int64, seq uint64) string {
	return region + "/" + room + "/" + strconv.FormatInt(epoch, 10) + "/" + strconv.FormatUint(seq, 10)
}

// decodeEntry turns an outbox entry of room in region into its
// transition. It never panics, and rejects what emit cannot have written
// (a wrong field count, numbers that do not parse, an unknown kind, no
// user).
func decodeEntry(region, room, e string) (presence.Transition, error) {
	f := strings.SplitN(e, "|", entryFields)
	if len(f) != entryFields {
		return presence.Transition{}, fmt.Errorf("want %d fields, got %d", entryFields, len(f))
	}
	seq, err1 := strconv.ParseUint(f[fieldSeq], 10, 64)
	n, err2 := strconv.Atoi(f[fieldSessions])
	at, err3 := strconv.ParseInt(f[fieldAt], 10, 64)
	epoch, err4 := strconv.ParseInt(f[fieldEpoch], 10, 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return presence.Transition{}, err
	}
	kind := presence.Kind(f[fieldKind])
	switch {
	case !kind.Valid():
		return presence.Transition{}, fmt.Errorf("unknown kind %q", f[fieldKind])
	case f[fieldUser] == "":
		return presence.Transition{}, errors.New("no user")
	case n < 0:
		return presence.Transition{}, fmt.Errorf("negative session count %d", n)
	}
	t := presence.Transition{
		ID:       transitionID(region, room, epoch, seq),
		Region:   region,
		Room:     room,
		User:     f[fieldUser],
		Kind:     kind,
		Reason:   presence.Reason(f[fieldReason]),
		Sessions: n,
		Seq:      seq,
		Epoch:    epoch,
		At:       time.UnixMilli(at),
		Session:  f[fieldSession],
	}
	if f[fieldState] != "" {
		t.State = json.RawMessage(f[fieldState])
	}
	return t, nil
}
