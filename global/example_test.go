package global_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/presence"
)

// A downstream service shows a room's global membership: it watches the
// room's global transitions first, then takes a snapshot, applies it, and
// applies every watched transition above the snapshot's RoomSeq. An
// aggregator must be running (presenced aggregator) for the queries to
// answer.
func ExampleClient() {
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	// Watch before the snapshot, so the snapshot misses nothing.
	events := make(chan presence.Transition, 256)
	sub, err := bus.WatchRoom(nc, bus.GlobalRegion, "room42", func(t presence.Transition) { events <- t })
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := global.NewClient(nc)
	snap, err := c.Snapshot(ctx, "room42", 0, 100)
	if err != nil {
		log.Fatal(err)
	}
	online := map[string]bool{}
	for _, m := range snap.Members {
		online[m.User] = true
	}
	fmt.Printf("%d online in room42 across regions\n", snap.Total)

	// One user, with the regions that hold their sessions.
	u, err := c.User(ctx, "room42", "u_8827")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("u_8827 online:", u.Online, "in", u.Regions)

	// Then follow (docs/GLOBAL.md): a transition at or below the
	// snapshot's room_seq is already in it; a later epoch, or a gap in
	// seq, means the room was renumbered or a message was lost: take a
	// new snapshot.
	next := snap.RoomSeq + 1
	for t := range events {
		if t.Epoch < snap.Epoch || t.Epoch == snap.Epoch && t.Seq < next {
			continue // already in the snapshot
		}
		if t.Epoch != snap.Epoch || t.Seq != next {
			fmt.Println("renumbered or lost: take a new snapshot")
			return
		}
		next++
		switch t.Kind {
		case presence.Online:
			online[t.User] = true
		case presence.Offline:
			delete(online, t.User) // reason region_lost: a whole region stopped reporting
		}
		fmt.Println(t.Kind, t.User, len(online))
	}
}
