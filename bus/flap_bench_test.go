package bus

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/presence"
)

// BenchmarkFlappingFeed is what FeedFlapping does for each event of the
// region on every node with API keys: an update (its body read for the
// reason) and an online (the subject only), each observed.
func BenchmarkFlappingFeed(b *testing.B) {
	for _, kind := range []presence.Kind{presence.Update, presence.Online} {
		b.Run(string(kind), func(b *testing.B) {
			tr := presence.Transition{ID: "eu/room-1/1764444000000/42", Region: "eu", Room: "room-1", User: "user-1",
				Kind: kind, Reason: presence.Joined, Session: "s1", Sessions: 2, Seq: 42, Epoch: 1764444000000, At: time.Now()}
			data, err := EncodeEvent(tr)
			if err != nil {
				b.Fatal(err)
			}
			m := &nats.Msg{Subject: EventSubject(tr), Data: data}
			f := NewFlapping(0, 0, nil)
			b.ReportAllocs()
			for b.Loop() {
				room, user, k := flapOf(m, "eu")
				if k != flapArrive {
					b.Fatalf("flapOf = %v %v %v", room, user, k)
				}
				f.observe(room, user, k)
			}
		})
	}
}
