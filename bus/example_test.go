package bus_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
)

// exampleRegion starts an in-process nats-server with region eu's stream
// and returns a connection to it and a publisher into the stream: what a
// node's regional store publishes through. stop ends it all.
func exampleRegion() (nc *nats.Conn, js jetstream.JetStream, pub *bus.Publisher, stop func(), err error) {
	s, stopServer, err := testnats.Run()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	nc, err = nats.Connect(s.ClientURL())
	if err != nil {
		stopServer()
		return nil, nil, nil, nil, err
	}
	stop = func() { nc.Close(); stopServer() }
	js, err = jetstream.New(nc)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = bus.EnsureStream(ctx, js, bus.StreamConfig{Region: "eu", Storage: jetstream.MemoryStorage})
	}
	if err != nil {
		stop()
		return nil, nil, nil, nil, err
	}
	return nc, js, bus.NewPublisher(js, "eu"), stop, nil
}

// transition is the n-th transition of room42 in region eu, as the
// regional store would make it.
func transition(seq uint64, kind presence.Kind, reason presence.Reason, user string, sessions int) presence.Transition {
	at := time.Date(2026, 11, 29, 19, 20, 0, 0, time.UTC).Add(time.Duration(seq) * time.Second)
	return presence.Transition{
		ID: fmt.Sprintf("eu/room42/1764444000000/%d", seq), Region: "eu", Room: "room42", User: user,
		Kind: kind, Reason: reason, Sessions: sessions, Seq: seq, Epoch: 1764444000000, At: at,
	}
}

// printTransitions prints the next n transitions from got, and reports
// whether all came within 10 seconds.
func printTransitions(got <-chan presence.Transition, n int) bool {
	for range n {
		select {
		case t := <-got:
			fmt.Println(t.Seq, t.Kind, t.Reason, t.User)
		case <-time.After(10 * time.Second):
			fmt.Println("no transition")
			return false
		}
	}
	return true
}

// A downstream service watches a room: every transition published from
// the moment WatchRoom returns.
func ExampleWatchRoom() {
	nc, _, pub, stop, err := exampleRegion()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

	got := make(chan presence.Transition, 8)
	sub, err := bus.WatchRoom(nc, "eu", "room42", func(t presence.Transition) { got <- t })
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()

	// A node publishes: u_8827 comes online, then leaves after the grace.
	ctx := context.Background()
	if _, err := pub.Publish(ctx, []presence.Transition{
		transition(1, presence.Online, presence.Joined, "u_8827", 1),
		transition(2, presence.Offline, presence.Left, "u_8827", 0),
	}); err != nil {
		fmt.Println(err)
		return
	}
	printTransitions(got, 2)
	// Output:
	// 1 online joined u_8827
	// 2 offline left u_8827
}

// Replay follows a room from a snapshot: it skips what the snapshot
// already holds and delivers every later transition once, in Seq order.
func ExampleReplay() {
	_, js, pub, stop, err := exampleRegion()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Two transitions are stored before the snapshot is taken ...
	if _, err := pub.Publish(ctx, []presence.Transition{
		transition(1, presence.Online, presence.Joined, "u_8827", 1),
		transition(2, presence.Online, presence.Joined, "u_9001", 1),
	}); err != nil {
		fmt.Println(err)
		return
	}
	// ... and the snapshot holds them: a real one comes from the region's
	// query service (bus.NewClient(nc, "eu").Snapshot), which reports the
	// room Seq and stream sequence it reflects.
	snap := presence.Snapshot{Region: "eu", Room: "room42", Total: 2, RoomSeq: 2, Epoch: 1764444000000, StreamSeq: 2}

	got := make(chan presence.Transition, 8)
	r, err := bus.Replay(ctx, js, "eu", "room42", snap, func(t presence.Transition) { got <- t })
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Stop()

	// Later transitions, one of them published twice (a redelivery):
	// the stream stores it once, and Replay delivers it once.
	for _, batch := range [][]presence.Transition{
		{transition(3, presence.Offline, presence.Left, "u_8827", 0)},
		{transition(3, presence.Offline, presence.Left, "u_8827", 0), transition(4, presence.Offline, presence.Expired, "u_9001", 0)},
	} {
		if _, err := pub.Publish(ctx, batch); err != nil {
			fmt.Println(err)
			return
		}
	}
	if !printTransitions(got, 2) {
		return
	}
	fmt.Println("through seq", r.Seq())
	// Output:
	// 3 offline left u_8827
	// 4 offline expired u_9001
	// through seq 4
}
