package latency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/presence-dev/presence/client"
	"github.com/presence-dev/presence/cmd/presence-load/internal/load"
	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
)

// openIdle opens the idle mode's sessions: each a client of the
// project's Go client, as a service or a bot that is present would be: it
// joins, then only reads (answering pings). Its view of the room costs
// this process, not the node; the room's events come during the fill,
// before the window measured. dropped counts the connections of joined
// clients that ended before the tool closed them (each client then
// reconnects).
func openIdle(ctx context.Context, d *load.Dialer, o load.Options) (clients []*client.Client, tally load.Tally, dropped *atomic.Int64) {
	run := rand.Uint32()
	clients = make([]*client.Client, o.Sessions)
	held := make([]atomic.Bool, o.Sessions) // joined, not yet closed by this tool
	dropped = new(atomic.Int64)
	tally = load.OpenEach(ctx, o.Sessions, 64, func(i int) error {
		c, err := d.Client(ctx, fmt.Sprintf("u%d-%d", run, i), fmt.Sprintf("s%d", i), func(error) {
			if held[i].Load() {
				dropped.Add(1)
			}
		})
		if err != nil {
			return err
		}
		if _, err := c.Join(ctx, fmt.Sprintf("load%d-%d", run, i/o.PerRoom), client.JoinOptions{}); err != nil {
			c.Close()
			return err
		}
		clients[i] = c
		held[i].Store(true)
		return nil
	})
	return clients, tally, dropped
}

// closeClients closes the open clients, 64 at a time (each waits for its
// connection's close).
func closeClients(cs []*client.Client) {
	load.OpenEach(context.Background(), len(cs), 64, func(i int) error {
		if cs[i] != nil {
			cs[i].Close()
		}
		return nil
	})
}

// Idle is the idle mode: --sessions sessions in rooms of --per-room,
// held; the node's RSS per session and the CPU of the node, Redis and
// nats-server per 10k sessions over the hold after a settle.
func Idle(ctx context.Context, o load.Options, out io.Writer) error {
	d, err := load.NewDialer(o)
	if err != nil {
		return err
	}
	meters, err := load.NewMeters(o, true)
	if err != nil {
		return err
	}
	rss0, err := load.Metric(o.Metrics, "process_resident_memory_bytes")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "node RSS before: %.1f MiB\n", rss0/(1<<20))
	start := time.Now()
	clients, tally, dropped := openIdle(ctx, d, o)
	defer closeClients(clients) // again after closeAndQuiesce: a client closes once
	open, failed := tally.Opened, o.Sessions-tally.Opened
	fmt.Fprintf(out, "opened %d sessions in %v (%d failed", open, time.Since(start).Round(time.Millisecond), failed)
	if tally.FirstErr != "" {
		fmt.Fprintf(out, "; first error: %s", tally.FirstErr)
	}
	fmt.Fprintln(out, ")")
	// Let the node settle (GC, first heartbeat round) before measuring.
	settle := min(o.Hold/3, 20*time.Second)
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	cpu0 := measure.ReadMeters(meters)
	t0 := time.Now()
	select {
	case <-time.After(o.Hold - settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	cpu := measure.Delta(cpu0, measure.ReadMeters(meters))
	window := time.Since(t0)
	rss1, err := load.Metric(o.Metrics, "process_resident_memory_bytes")
	if err != nil {
		return err
	}
	if open == 0 {
		return errors.New("no session opened")
	}
	perSession := (rss1 - rss0) / float64(open)
	fmt.Fprintf(out, "node RSS with %d sessions: %.1f MiB; per session: %.1f KiB\n", open, rss1/(1<<20), perSession/1024)
	if err := reportIdleCPU(out, cpu, window, open); err != nil {
		return err
	}
	if err := closeAndQuiesce(ctx, o, out, clients, open); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("FAIL: %d of %d sessions failed to open", failed, o.Sessions)
	}
	if n := dropped.Swap(0); n > 0 {
		return fmt.Errorf("FAIL: the node dropped %d connections during the run (each client reconnected)", n)
	}
	return nil
}

// closeAndQuiesce closes the clients and waits, up to --quiesce (default
// 90s), for the node to deliver their departures, one offline each, a
// grace after the close: a run that follows (versus runs latency next)
// would otherwise measure its joins beside a burst of them.
func closeAndQuiesce(ctx context.Context, o load.Options, out io.Writer, clients []*client.Client, open int) error {
	before, err := load.Metric(o.Metrics, "presence_region_transitions_total")
	if err != nil {
		return err
	}
	closeClients(clients)
	t0 := time.Now()
	bound := o.Quiesce
	if bound == 0 {
		bound = 90 * time.Second
	}
	var got float64
	for time.Since(t0) < bound {
		if got, err = load.Metric(o.Metrics, "presence_region_transitions_total"); err == nil && got-before >= float64(open) {
			fmt.Fprintf(out, "closed; the node delivered their %d departures %v after the close\n", open, time.Since(t0).Round(100*time.Millisecond))
			return nil
		}
		if !load.SleepCtx(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("FAIL: %v after the close the node had delivered %.0f transitions, want the %d departures", bound, got-before, open)
}

// reportIdleCPU prints the CPU of each process over the window, as % of
// one core, and the same per 10k of the open sessions; the sum is node +
// Redis + NATS.
func reportIdleCPU(out io.Writer, cpu []measure.Reading, window time.Duration, open int) error {
	var sum float64
	var per []string
	for _, r := range cpu {
		if r.Err != nil {
			return fmt.Errorf("%s CPU (%s): %w", r.Name, r.Source, r.Err)
		}
		pct := r.Secs / window.Seconds() * 100
		if r.Name == "machine" || r.Name == "load tool" || r.Name == measure.StealName {
			// Context, not a cost of the sessions.
			continue
		}
		sum += pct
		fmt.Fprintf(out, "%s idle CPU over %.0fs: %.2f%% of one core (%s)\n", r.Name, window.Seconds(), pct, r.Source)
		per = append(per, fmt.Sprintf("%s %.2f%%", r.Name, pct*10000/float64(open)))
	}
	fmt.Fprintf(out, "CPU per 10k sessions, %% of one core: %s; sum %.2f%%\n", strings.Join(per, ", "), sum*10000/float64(open))
	if len(per) < 3 {
		fmt.Fprintln(out, "(the sum covers only the processes above: give --redis and --nats-pid or --nats-monitor for the rest)")
	}
	fmt.Fprintf(out, "context, %% of one core: %s\n", measure.FmtCPU(cpu, window))
	if pct, ok := measure.OtherCPU(cpu, window); ok && pct > disturbedCPU {
		fmt.Fprintf(out, "warning: other processes used %.0f%% of a core during the window; the CPU figures may be disturbed\n", pct)
	}
	return nil
}

// joinAtOnce has every joiner join room at the same moment and returns
// each one's join -> snapshot time (0 where it failed), the failures and
// how long the storm took.
func joinAtOnce(joiners []*websocket.Conn, room string) ([]time.Duration, int64, time.Duration) {
	lat := make([]time.Duration, len(joiners))
	var failed atomic.Int64
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i, c := range joiners {
		if c == nil {
			failed.Add(1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			t0 := time.Now()
			if load.JoinRoom(c, room) != nil {
				failed.Add(1)
				return
			}
			lat[i] = time.Since(t0)
		}()
	}
	t0 := time.Now()
	close(gate)
	wg.Wait()
	return lat, failed.Load(), time.Since(t0)
}

// Storm fills a room with members, then has joiners join it all at once,
// and reports each joiner's join -> snapshot time and how many snapshot
// reads the node made for the storm (joiners of one room share reads).
func Storm(ctx context.Context, o load.Options, out io.Writer) error {
	d, err := load.NewDialer(o)
	if err != nil {
		return err
	}
	run := rand.Uint32()
	room := fmt.Sprintf("storm%d", run)
	start := time.Now()
	members, failedMembers, _ := load.OpenAll(ctx, d, o.Members, func(i int) (string, string, string) {
		return fmt.Sprintf("m%d-%d", run, i), "s", room
	}, load.Drain)
	defer load.CloseAll(members)
	ok := o.Members - failedMembers
	fmt.Fprintf(out, "room of %d members filled in %v (%d failed)\n", ok, time.Since(start).Round(time.Millisecond), failedMembers)
	joiners, _, _ := load.OpenAll(ctx, d, o.Joiners, func(i int) (string, string, string) {
		return fmt.Sprintf("j%d-%d", run, i), "s", ""
	}, nil)
	defer load.CloseAll(joiners)
	for _, c := range joiners {
		// Drain the hello, so the join's reply is what joinRoom reads.
		if c != nil {
			_, _, _ = c.ReadMessage()
		}
	}
	before, err := load.Metric(o.Metrics, "presence_node_join_snapshot_reads_total")
	if err != nil {
		return err
	}
	lat, failed, elapsed := joinAtOnce(joiners, room)
	after, err := load.Metric(o.Metrics, "presence_node_join_snapshot_reads_total")
	if err != nil {
		return err
	}
	lat = slices.DeleteFunc(lat, func(d time.Duration) bool { return d == 0 })
	if len(lat) == 0 {
		return errors.New("no joiner got its snapshot")
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	fmt.Fprintf(out, "%d joins at once into a room of %d in %v (%d failed); %.0f snapshot reads\n",
		len(lat), ok, elapsed.Round(time.Millisecond), failed, after-before)
	fmt.Fprintf(out, "join -> snapshot: p50 %v  p90 %v  p99 %v  max %v\n",
		q(0.50).Round(10*time.Microsecond), q(0.90).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))
	return nil
}
