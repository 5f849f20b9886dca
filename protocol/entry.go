package protocol

import (
	"encoding/json"
	"fmt"

	"github.com/presence-dev/presence/presence"
)

// DecodeEntry reads one entry of an events frame,
// [seq,kind,reason,user,session,sessions] with the state last on an
// update that sets one, as the transition it stands for. The frame gives
// its room, region and epoch. An entry names no session with "".
func DecodeEntry(f *Events, raw json.RawMessage) (presence.Transition, error) {
	t := presence.Transition{Room: f.Room, Region: f.Region, Epoch: f.Epoch}
	var a []json.RawMessage
	if err := json.Unmarshal(raw, &a); err != nil || len(a) < 6 || len(a) > 7 {
		return t, fmt.Errorf("protocol: malformed events entry %.100s", raw)
	}
	for i, dst := range []any{&t.Seq, &t.Kind, &t.Reason, &t.User, &t.Session, &t.Sessions} {
		if err := json.Unmarshal(a[i], dst); err != nil {
			return t, fmt.Errorf("protocol: events entry %.100s, field %d: %w", raw, i, err)
		}
	}
	if !t.Kind.Valid() {
		return t, fmt.Errorf("protocol: events entry %.100s: unknown kind %q", raw, t.Kind)
	}
	if err := presence.ValidateUser(t.User); err != nil {
		return t, fmt.Errorf("protocol: events entry %.100s: %w", raw, err)
	}
	if len(a) == 7 {
		t.State = a[6]
	}
	return t, nil
}
