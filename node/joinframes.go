package node

import (
	"time"

	"github.com/presence-dev/presence/presence"
)

// joinFrames keeps the last snapshot frame and the last frame of events
// after a snapshot that joiners were sent: the joiners served by one read
// (a fill, a storm) mostly get the same bytes, a snapshot frame of up to
// SnapshotMembers members differing only by its ref, which clients
// mostly number alike. Frames are never changed once sent, so they are
// shared.
type joinFrames struct {
	snapKey  joinSnapKey
	snap     []byte
	evKey    joinEventsKey
	evFrame  []byte
	evEncode bool
}

type joinSnapKey struct {
	ref, reason, room string
	truncated         bool
	body              *byte // the body's array: one per read and detail
	n                 int
}

type joinEventsKey struct {
	view               string
	after, first, last uint64
	n                  int
	d                  detail
}

func (j *joinFrames) snapshot(ref, reason string, snap presence.Snapshot, d detail, body []byte) []byte {
	k := joinSnapKey{ref, reason, snap.Room, snap.Total > len(snap.Members), nil, len(body)}
	if len(body) > 0 {
		k.body = &body[0]
	}
	if j.snap == nil || k != j.snapKey {
		j.snapKey, j.snap = k, encodeSnapshotBody(ref, reason, snap.Room, k.truncated, body)
	}
	return j.snap
}

// events is the events frame of r.buffered above after (nil: none).
func (j *joinFrames) events(r *room, after uint64, d detail) []byte {
	n := len(r.buffered)
	if n == 0 {
		return nil
	}
	k := joinEventsKey{r.view, after, r.buffered[0].seq, r.buffered[n-1].seq, n, d}
	if !j.evEncode || k != j.evKey {
		j.evKey, j.evFrame, j.evEncode = k, encodeEvents(r.view, r.name, r.buffered, after, d), true
	}
	return j.evFrame
}

// snapBodies keeps the encoded body of a room's latest snapshot per
// detail: the joiners of a storm share a few reads, and each read's body
// (up to SnapshotMembers members) is encoded once, not once per joiner.
type snapBodies struct {
	key  snapKey
	body [detailSessions + 1][]byte
}

// snapKey tells snapshots apart: one read of the room at a room_seq and a
// millisecond has one content.
type snapKey struct {
	region        string
	epoch         int64
	seq           uint64
	at            time.Time
	offset, total int
	members       int
}

func (b *snapBodies) get(s presence.Snapshot, d detail) []byte {
	k := snapKey{s.Region, s.Epoch, s.RoomSeq, s.At, s.Offset, s.Total, len(s.Members)}
	if k != b.key {
		*b = snapBodies{key: k}
	}
	if b.body[d] == nil {
		fs := forDetail(s, d)
		b.body[d] = appendSnapshotBody(make([]byte, 0, 256+len(fs.Members)*160), fs)
	}
	return b.body[d]
}
