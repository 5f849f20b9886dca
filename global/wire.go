package global

import (
	"fmt"
	"strings"

	"github.com/presence-dev/presence/bus"
)

// Names on the wire that package global owns. The subjects themselves are
// built in package bus (bus/subject.go holds the whole namespace).

// DeltaSubject is bus.SyncDeltaSubject.
//
// Deprecated: the subject namespace lives in package bus; use
// bus.SyncDeltaSubject.
func DeltaSubject(region string) string { return bus.SyncDeltaSubject(region) }

// FullSubject is bus.SyncFullSubject.
//
// Deprecated: the subject namespace lives in package bus; use
// bus.SyncFullSubject.
func FullSubject(region string) string { return bus.SyncFullSubject(region) }

// keyEscape maps a region id onto the bytes KV bucket names allow
// ([A-Za-z0-9_-]): other bytes, and '_' itself, become _XX (hex).
func keyEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "_%02X", c)
		}
	}
	return b.String()
}
