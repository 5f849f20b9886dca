package bus

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/presence"
)

// The observer token is for console-<key name>, cut to a user id's
// length; the room is checked first; without a signer, 501.
func TestObserverTokenUserAndRoom(t *testing.T) {
	var got []string
	o := &Operations{View: "eu", Mint: func(user, room string, ttl time.Duration) (string, error) {
		got = append(got, user+" "+room+" "+ttl.String())
		return "a.b.c", nil
	}}
	long := strings.Repeat("k", 64)
	rep, err := o.ObserverToken(context.Background(), long, ObserverTokenRequest{Room: "lobby"})
	if err != nil || len(rep.User) != presence.MaxUserLen || !strings.HasPrefix(rep.User, "console-kkk") || rep.Token != "a.b.c" {
		t.Fatalf("%+v %v", rep, err)
	}
	if len(got) != 1 || !strings.HasSuffix(got[0], " lobby "+ObserverTTL.String()) {
		t.Fatalf("minted %q", got)
	}
	if _, err := o.ObserverToken(context.Background(), "ops", ObserverTokenRequest{Room: "a.b"}); AsQueryError(err).Code != CodeBadRequest || len(got) != 1 {
		t.Fatalf("bad room: %v (minted %q)", err, got)
	}
	o.Mint = nil
	if _, err := o.ObserverToken(context.Background(), "ops", ObserverTokenRequest{Room: "lobby"}); AsQueryError(err).Code != CodeNotImplemented {
		t.Fatalf("no signer: %v", err)
	}
}
