package global

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// digest is a checksum of a region's view (members, their session ids and
// the sessions' states): the sum, mod 2^64, of an FNV-1a hash per member,
// so it does not depend on map order and a publisher and an aggregator
// holding the same view compute the same value. A publisher sends the
// digest of what it has published now and then (PublisherConfig.FullEvery);
// an aggregator whose copy differs asks for a full. That is the
// anti-entropy of the publication path: fulls go out only when a digest
// disagrees, not periodically.
func digest(v regionView, st stateView) string {
	var sum uint64
	for room, users := range v {
		for u, ss := range users {
			h := fnvString(fnvOffset, room)
			h = fnvByte(h, 0)
			h = fnvString(h, u)
			h = fnvByte(h, 0)
			states := st[room][u]
			for _, s := range ss {
				h = fnvString(h, s)
				h = fnvByte(h, 1)
				if j, ok := states[s]; ok {
					h = fnvString(h, canonState(j))
				}
				h = fnvByte(h, 2)
			}
			sum += h
		}
	}
	return strconv.FormatUint(sum, 16)
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvByte(h uint64, b byte) uint64 { return (h ^ uint64(b)) * fnvPrime }

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return h
}

// canonState is a state as a publication carries it: json.Marshal escapes
// <, >, &, U+2028 and U+2029 in a json.RawMessage, so the publisher's
// copy (as read from Redis) and the aggregator's (as received) only agree
// after the same escaping.
func canonState(s string) string {
	if !strings.ContainsAny(s, "<>&\u2028\u2029") {
		return s
	}
	var b bytes.Buffer
	json.HTMLEscape(&b, []byte(s))
	return b.String()
}
