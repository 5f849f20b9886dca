package bus_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// lossyNATS is a nats-server that can be restarted on the same port with
// an empty store: its JetStream volume lost.
type lossyNATS struct {
	tb   testing.TB
	opts *server.Options
	s    *server.Server
}

func startLossyNATS(tb testing.TB) *lossyNATS {
	n := &lossyNATS{tb: tb, opts: testnats.Options(tb)}
	n.s = testnats.StartWith(tb, n.opts)
	n.opts.Port = n.s.Addr().(*net.TCPAddr).Port
	return n
}

// stop shuts the server down; restartEmpty starts it again on a new
// store directory.
func (n *lossyNATS) stop() { n.s.Shutdown(); n.s.WaitForShutdown() }

func (n *lossyNATS) restartEmpty() {
	o := *n.opts
	o.StoreDir = n.tb.TempDir()
	n.s = testnats.StartWith(n.tb, &o)
}

// keeper refreshes its sessions every heartbeat, as a live node does.
type keeper struct {
	mu   sync.Mutex
	refs map[presence.SessionRef]bool
}

func keep(tb testing.TB, st *region.Store) *keeper {
	k := &keeper{refs: map[presence.SessionRef]bool{}}
	c, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c.Err() == nil {
			k.mu.Lock()
			refs := slices.Collect(maps.Keys(k.refs))
			k.mu.Unlock()
			_, _ = st.Refresh(c, refs)
			select {
			case <-c.Done():
			case <-time.After(testTiming.Heartbeat):
			}
		}
	}()
	tb.Cleanup(func() { cancel(); <-done })
	return k
}

func (k *keeper) join(tb testing.TB, st *region.Store, user string) {
	tb.Helper()
	r := ref("room", user, "tab")
	if _, err := st.Claim(context.Background(), []presence.SessionRef{r}); err != nil {
		tb.Fatal(err)
	}
	k.mu.Lock()
	k.refs[r] = true
	k.mu.Unlock()
}

func (k *keeper) leave(tb testing.TB, st *region.Store, user string) {
	tb.Helper()
	r := ref("room", user, "tab")
	k.mu.Lock()
	delete(k.refs, r)
	k.mu.Unlock()
	if err := st.Release(context.Background(), r); err != nil {
		tb.Fatal(err)
	}
}

// streamFold reads a room from the region's stream through a durable
// consumer, at its own pace, as a downstream service does, following
// BUS.md: snapshot, then the transitions above its room_seq in seq
// order; a later epoch: a fresh snapshot. It does not look at the
// stream's identity: the epoch alone must tell it.
type streamFold struct {
	tb     testing.TB
	js     jetstream.JetStream
	st     *region.Store
	view   map[string]bool
	epoch  int64
	seq    uint64
	resync int // fresh snapshots taken after the first
	cons   jetstream.Consumer
}

func (f *streamFold) snapshot() presence.Snapshot {
	snap, err := f.st.Snapshot(context.Background(), "room", 0, bus.MaxLimit)
	if err != nil {
		f.tb.Fatal(err)
	}
	f.view = map[string]bool{}
	for _, m := range snap.Members {
		f.view[m.User] = true
	}
	f.epoch, f.seq = snap.Epoch, snap.RoomSeq
	return snap
}

// consumer creates the durable consumer from stream sequence from (0:
// the stream's first message).
func (f *streamFold) consumer(from uint64) error {
	cfg := jetstream.ConsumerConfig{Durable: "fold", FilterSubject: bus.RoomFilter("eu", "room"),
		AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	c, err := f.js.CreateOrUpdateConsumer(context.Background(), bus.StreamName("eu"), cfg)
	f.cons = c
	return err
}

// read folds what the consumer has now. A consumer gone with its stream
// is made again on the new stream, from its first message.
func (f *streamFold) read() error {
	for {
		n, err := f.fetch()
		if err != nil {
			if _, cerr := f.js.Consumer(context.Background(), bus.StreamName("eu"), "fold"); errors.Is(cerr, jetstream.ErrConsumerNotFound) {
				if err := f.consumer(0); err != nil {
					return err
				}
				continue
			}
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

// fetch folds one batch and returns its size.
func (f *streamFold) fetch() (int, error) {
	batch, err := f.cons.FetchNoWait(100)
	if err != nil {
		return 0, err
	}
	n := 0
	for m := range batch.Messages() {
		n++
		t, err := bus.DecodeEvent(m.Data())
		if err != nil {
			f.tb.Fatal(err)
		}
		f.apply(t)
		_ = m.Ack()
	}
	return n, batch.Error()
}

func (f *streamFold) apply(t presence.Transition) {
	switch {
	case t.Epoch < f.epoch:
		return // of an earlier numbering
	case t.Epoch > f.epoch:
		f.resync++
		f.snapshot()
		if t.Epoch < f.epoch || t.Seq <= f.seq {
			return
		}
	case t.Seq <= f.seq:
		return
	}
	// Everything was stored before this read: a missing seq will not
	// come (a reader with a gap timeout ends here too, later).
	f.seq = t.Seq
	switch t.Kind {
	case presence.Online:
		f.view[t.User] = true
	case presence.Offline:
		delete(f.view, t.User)
	}
}

func (f *streamFold) members() []string { return slices.Sorted(maps.Keys(f.view)) }

// The region's JetStream store is lost: nats-server restarts on an empty
// store while transitions a reader had not read yet were in the old
// stream, and more happen while it is down. The nodes make the stream
// again; the room's first transition in it opens a new epoch. A reader of
// the stream that folds it by BUS.md alone, and a bus.Replay started from
// a snapshot read before the loss, both end with the room as a fresh
// snapshot has it.
func TestALostStreamStartsANewEpochReadersEndWithTheTruth(t *testing.T) {
	ns := startLossyNATS(t)
	nc, err := nats.Connect(ns.s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := bus.EnsureStream(ctx(t), js, bus.StreamConfig{Region: "eu"}); err != nil {
		t.Fatal(err)
	}
	rdb, _ := testredis.Client(t)
	st, err := region.New(rdb, region.Options{Region: "eu", Sink: bus.NewPublisher(js, "eu"), Timing: testTiming,
		PublishLease: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	startReaper(t, st)
	k := keep(t, st)
	for _, u := range []string{"u1", "u2", "u3", "u4"} {
		k.join(t, st, u)
	}
	stream, _ := js.Stream(ctx(t), bus.StreamName("eu"))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("messages in the stream, the joins", streamInfo(t, stream).State.Msgs, 4)
	})

	fold := &streamFold{tb: t, js: js, st: st}
	before := fold.snapshot()
	if err := fold.consumer(before.StreamSeq + 1); err != nil {
		t.Fatal(err)
	}
	if err := fold.read(); err != nil {
		t.Fatal(err)
	}
	oldEpoch := fold.epoch

	// Stored in the old stream, never read by the fold.
	k.join(t, st, "u5")
	k.leave(t, st, "u1")
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("messages in the stream, with u5's join and u1's departure", streamInfo(t, stream).State.Msgs, 6)
	})

	ns.stop()
	k.join(t, st, "u6")
	k.leave(t, st, "u2")
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		snap, err := st.Snapshot(context.Background(), "room", 0, bus.MaxLimit)
		if err != nil {
			return err
		}
		return testkit.Want("room seq, u2's departure decided", snap.RoomSeq, 8)
	})
	ns.restartEmpty()
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		s, err := js.Stream(context.Background(), bus.StreamName("eu"))
		if err != nil {
			return fmt.Errorf("the stream not made again: %w", err)
		}
		return testkit.AtLeast("messages in the new stream, what waited", s.CachedInfo().State.Msgs, 2)
	})

	want := []string{"u3", "u4", "u5", "u6"}
	truth := func() []string {
		snap, err := st.Snapshot(context.Background(), "room", 0, bus.MaxLimit)
		if err != nil {
			t.Fatal(err)
		}
		var us []string
		for _, m := range snap.Members {
			us = append(us, m.User)
		}
		return us
	}
	if got := truth(); !slices.Equal(got, want) {
		t.Fatalf("the store holds %v, want %v", got, want)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if err := fold.read(); err != nil {
			return fmt.Errorf("fold: %w", err)
		}
		return testkit.WantSlice("the fold (the truth)", fold.members(), truth())
	})
	if fold.epoch <= oldEpoch || fold.resync == 0 {
		t.Fatalf("the fold is at epoch %d (was %d) after %d fresh snapshots: the new stream opened no new epoch", fold.epoch, oldEpoch, fold.resync)
	}

	// A replay from the snapshot read before the loss.
	view := followRoom(t, js, before, func(c context.Context) (presence.Snapshot, error) {
		return st.Snapshot(c, "room", 0, bus.MaxLimit)
	})
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.WantSlice("the replay (the truth)", view.members(), truth())
	})
}
