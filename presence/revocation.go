package presence

import (
	"errors"
	"fmt"
	"time"
)

// MaxRevocation is the longest a revocation may last. Longer bans belong
// to whoever mints the user's tokens: stop minting them.
const MaxRevocation = 30 * 24 * time.Hour

// Revocation bars a user from a region until a moment: from one room, or,
// with Room empty, from connecting at all. The server API writes it when
// it disconnects a user; every node of the region refuses the user's
// joins (or connections) while it lasts.
type Revocation struct {
	User  string    `json:"user"`
	Room  string    `json:"room,omitempty"`
	Until time.Time `json:"until"`
}

// Validate checks the ids and that Until lies after now and at most
// MaxRevocation after it.
func (r Revocation) Validate(now time.Time) error {
	err := ValidateUser(r.User)
	if r.Room != "" {
		err = errors.Join(err, ValidateRoom(r.Room))
	}
	if err != nil {
		return err
	}
	if !r.Until.After(now) {
		return fmt.Errorf("presence: revocation of %q ends at %s, not after now (%s)", r.User, r.Until.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	if r.Until.Sub(now) > MaxRevocation {
		return fmt.Errorf("presence: revocation of %q lasts %s, at most %s", r.User, r.Until.Sub(now).Round(time.Second), MaxRevocation)
	}
	return nil
}

// Bars reports whether r keeps user out of room at now (room empty: out
// of connecting, which only a revocation of every room does).
func (r Revocation) Bars(user, room string, now time.Time) bool {
	return r.User == user && (r.Room == "" || r.Room == room) && now.Before(r.Until)
}
