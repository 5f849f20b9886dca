package webhook

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/presence-dev/presence/bus"
)

// BodyType is the type of every delivery's body.
const BodyType = "presence.events"

// KindResync is the one kind a delivery carries besides the events of
// docs/BUS.md: the room's events that follow do not continue what the
// endpoint was sent before, and it must take a fresh snapshot of the room.
const KindResync = "resync"

// Reasons of a resync marker.
const (
	ResyncNewEpoch    = "new_epoch"    // the room's numbering restarted (BUS.md, Room numbering)
	ResyncGap         = "gap"          // a seq never reached the stream within the gap timeout
	ResyncDeadLetter  = "dead_letter"  // events of the room went to the dead-letter stream
	ResyncStreamReset = "stream_reset" // the stream was made again (its store lost); this room's continuity is unknown
)

// Body is what a delivery carries: Standard Webhooks' type and
// timestamp (of the latest item), and the items in order: the room's
// events exactly as BUS.md encodes them, in seq order per room, and
// resync markers.
type Body struct {
	Type      string            `json:"type"`
	Timestamp string            `json:"timestamp"`
	Events    []json.RawMessage `json:"events"`
}

// Marker is a resync item. Epoch and Seq are the room's position after
// the break: the events that follow continue from Seq+1 of Epoch.
type Marker struct {
	V      int    `json:"v"`
	ID     string `json:"id"`
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
	Region string `json:"region"`
	Room   string `json:"room"`
	Epoch  int64  `json:"epoch"`
	Seq    uint64 `json:"seq"`
	At     string `json:"at"`
}

const atLayout = "2006-01-02T15:04:05.000Z"

// markerID is stable for one break of one room: the same on every retry
// and from every dispatcher that meets the same break.
func markerID(region, room string, epoch int64, seq uint64, reason string) string {
	return region + "/" + room + "/" + strconv.FormatInt(epoch, 10) + "/" + strconv.FormatUint(seq, 10) + "/" + reason
}

func newMarker(region, room string, epoch int64, seq uint64, reason string, at time.Time) (string, json.RawMessage) {
	m := Marker{V: bus.EventVersion, ID: markerID(region, room, epoch, seq, reason), Kind: KindResync, Reason: reason,
		Region: region, Room: room, Epoch: epoch, Seq: seq, At: at.UTC().Format(atLayout)}
	b, _ := json.Marshal(m) // strings and numbers only
	return m.ID, b
}

// batchID names a delivery of several items: a digest of their ids, so
// a retry of the same items carries the same id.
func batchID(ids []string) string {
	h := sha256.Sum256([]byte(strings.Join(ids, "\n")))
	return "batch_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h[:16]))
}

// encodeBody writes the body of items (ids and JSON, in order), latest
// their newest time.
func encodeBody(items [][]byte, latest time.Time) []byte {
	raw := make([]json.RawMessage, len(items))
	for i, it := range items {
		raw[i] = it
	}
	b, _ := json.Marshal(Body{Type: BodyType, Timestamp: latest.UTC().Format(atLayout), Events: raw})
	return b
}
