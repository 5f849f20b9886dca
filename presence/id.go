package presence

import (
	"fmt"
)

// Id length limits. Ids appear in NATS subject tokens and Redis keys, so
// they are short and drawn from a small alphabet.
const (
	MaxRoomLen    = 128
	MaxUserLen    = 64
	MaxSessionLen = 64
	MaxRegionLen  = 32
)

// IDError says which id is invalid and which rule it breaks.
type IDError struct {
	Field string // "room", "user", "session" or "region"
	Value string // the rejected value, cut to 80 bytes
	Rule  string
}

func (e *IDError) Error() string {
	return fmt.Sprintf("presence: invalid %s id %q: %s", e.Field, e.Value, e.Rule)
}

// Allowed bytes: ASCII letters, digits and - _ = @ + ~. Everything a NATS
// subject token or a Redis hash tag treats specially (. * > { } whitespace)
// is outside it, and so are ':' and '/', which the store and event ids use
// as separators, and the glob characters of SCAN MATCH.
var idByte = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "-_=@+~" {
		t[c] = true
	}
	return t
}()

func checkID(field, v string, max int) error {
	if v == "" {
		return &IDError{Field: field, Value: v, Rule: "must not be empty"}
	}
	if len(v) > max {
		return &IDError{Field: field, Value: v[:min(len(v), 80)], Rule: fmt.Sprintf("longer than %d bytes", max)}
	}
	for i := 0; i < len(v); i++ {
		if !idByte[v[i]] {
			return &IDError{Field: field, Value: v, Rule: fmt.Sprintf("byte %q at offset %d is not allowed (use letters, digits and - _ = @ + ~)", v[i], i)}
		}
	}
	return nil
}

// ValidateRoom reports whether room is a valid room id.
func ValidateRoom(room string) error { return checkID("room", room, MaxRoomLen) }

// ValidateUser reports whether user is a valid user id.
func ValidateUser(user string) error { return checkID("user", user, MaxUserLen) }

// ValidateSession reports whether session is a valid session id.
func ValidateSession(session string) error { return checkID("session", session, MaxSessionLen) }

// ValidateRegion reports whether region is a valid region name.
func ValidateRegion(region string) error { return checkID("region", region, MaxRegionLen) }

// SessionRef names one session of one user in one room.
type SessionRef struct {
	Room    string
	User    string
	Session string
}

// Validate checks all three ids.
func (r SessionRef) Validate() error {
	if err := ValidateRoom(r.Room); err != nil {
		return err
	}
	if err := ValidateUser(r.User); err != nil {
		return err
	}
	return ValidateSession(r.Session)
}
