// Command presence-load measures an edge node under load from a separate
// process, talking to it only as clients and operators do: WebSocket,
// NATS, the node's /metrics, Redis's INFO and nats-server's CPU.
//
// Modes:
//
//   - idle: many idle sessions; the node's RSS per session, and the CPU of
//     the node, Redis and nats-server over the same window, per 10k
//     sessions.
//   - latency: joins at a fixed rate on an absolute schedule. Every join is
//     a user's first session in its room, so it produces exactly one
//     online event, which is awaited on two paths: a NATS subscriber on
//     presence.<region>.> and a watcher WebSocket joined to the room
//     beforehand. Every join is accounted for: seen (late ones with their
//     real latency), missing, replaced by a resync snapshot (WebSocket
//     path), or refused by the node. A join never seen on a path ranks as
//     infinitely late in that path's percentiles, and anything missing,
//     replaced or refused fails the run.
//   - sweep: the latency run at increasing rates against the same node,
//     with fresh users, rooms and connections per step, the node left to
//     go quiet between steps; then the highest rate within the p99 target
//     and the first rate past the collapse bound.
//   - storm: joins at once into a large room; join -> snapshot times.
//   - bigroom: docs/PROTOCOL.md "Big rooms" at 15,000 members: fill,
//     churn, storm (members taking `events`), count-only watchers, watch
//     lists; frames per member per tick, join -> visible, and views checked
//     against a fresh read of the room (bigroom.go). Its connections live
//     in bigroom-worker child processes.
//   - centrifugo: the side by side with Centrifugo v6: a
//     channel of 15,000 subscribers with join_leave, filled, then churned
//     at increasing rates until Centrifugo breaks (centrifugo.go). Its
//     connections live in centrifugo-worker child processes.
//   - reconnect: the reconnect storm, 200,000 sessions back within
//     a minute on one Redis, driven on the store by stand-ins for nodes
//     that use the node's own join limiter and extender (reconnect.go).
//   - hog: busy-loops goroutines (a CPU tenant beside the node; latency
//     --hog N starts one as a child process).
//
// Requests are bounded in count and time and go only to the addresses
// given (loopback). Connections per run stay under --max-conns, itself
// under this process's open-files limit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/presence-dev/presence/cmd/presence-load/internal/bigroom"
	"github.com/presence-dev/presence/cmd/presence-load/internal/centrifugo"
	"github.com/presence-dev/presence/cmd/presence-load/internal/latency"
	"github.com/presence-dev/presence/cmd/presence-load/internal/load"
	"github.com/presence-dev/presence/cmd/presence-load/internal/reconnect"
	"github.com/presence-dev/presence/cmd/presence-load/internal/regionload"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "presence-load:", err)
		os.Exit(1)
	}
}

const usage = "usage: presence-load idle|latency|sweep|storm|bigroom|centrifugo|cf-idle|cf-latency|versus|reconnect|hog|region [flags] (-h for the flags of a mode)"

// runRegion runs the region mode, which has its own flags, or its child
// (region-driver: a node's sessions on the store).
func runRegion(ctx context.Context, args []string, out io.Writer) error {
	if args[0] == "region-driver" {
		return regionload.RegionDriverMain(ctx, args[1:], os.Stdin, out)
	}
	if args[0] == "region" {
		return regionload.RegionMode(ctx, args[1:], out)
	}
	return errors.New(usage)
}

// runOwn runs the modes that parse their own flags, and the child
// processes of the others; ok false for the rest.
func runOwn(ctx context.Context, args []string, out io.Writer) (ok bool, err error) {
	switch {
	case len(args) == 0:
		return false, nil
	case args[0] == "bigroom-worker":
		// A child of the bigroom mode: requests on stdin, replies on stdout.
		load.RaiseFileLimit()
		return true, bigroom.WorkerMain(ctx, os.Stdin, out)
	case strings.HasPrefix(args[0], "region"):
		return true, runRegion(ctx, args, out)
	case args[0] == "reconnect":
		load.RaiseFileLimit()
		return true, reconnect.Reconnect(ctx, args[1:], out)
	case args[0] == "versus":
		return true, centrifugo.Versus(args[1:], out)
	case args[0] == "centrifugo-worker":
		load.RaiseFileLimit()
		return true, centrifugo.WorkerMain(ctx, os.Stdin, out)
	}
	return false, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if ok, err := runOwn(ctx, args, out); ok {
		return err
	}
	modes := []string{"idle", "latency", "sweep", "storm", "bigroom", "centrifugo", "cf-idle", "cf-latency", "hog"}
	if len(args) == 0 || !slices.Contains(modes, args[0]) {
		return errors.New(usage)
	}
	mode := args[0]
	fs := flag.NewFlagSet("presence-load "+mode, flag.ContinueOnError)
	var o load.Options
	load.RegisterFlags(fs, &o)
	var big bigroom.BigOpts
	bigroom.RegisterBigFlags(fs, &big)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q; %s", fs.Args(), usage)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.Metrics == "" {
		o.Metrics = "http://" + o.Addr + "/metrics"
	}
	o.Insecure = o.Secret == ""
	if o.PerRoom == 0 {
		o.PerRoom = 50
		if mode == "idle" || mode == "cf-idle" {
			o.PerRoom = 100
		}
	}
	if mode == "hog" {
		if !set["duration"] {
			o.Duration = 0
		}
		return latency.Hog(ctx, o, out)
	}
	limit := load.RaiseFileLimit()
	switch mode {
	case "idle":
		return latency.Idle(ctx, o, out)
	case "cf-idle":
		return centrifugo.CfIdle(ctx, o, big.NodePID, out)
	case "cf-latency":
		return centrifugo.CfLatency(ctx, o, out)
	case "storm":
		return latency.Storm(ctx, o, out)
	case "bigroom":
		return bigroom.Bigroom(ctx, o, big, out)
	case "centrifugo":
		if o.Sweep == "" {
			o.Sweep = "10,25,50,100"
		}
		if !set["churn-for"] {
			big.ChurnFor = 20 * time.Second
		}
		return centrifugo.Centrifugo(ctx, o, big, out)
	case "sweep":
		if o.Sweep == "" {
			o.Sweep = "250,500,1000,1500,2000"
		}
	}
	if o.Rate <= 0 || o.PerRoom < 1 || o.MaxConns < o.PerRoom+1 {
		return errors.New("--rate must be positive, --per-room at least 1 and --max-conns above --per-room")
	}
	// Keep headroom under the open-files limit for NATS, HTTP and the
	// runtime's own descriptors.
	if uint64(o.MaxConns)+256 > limit {
		fmt.Fprintf(out, "--max-conns %d lowered to %d: this process may open %d files\n", o.MaxConns, limit-256, limit)
		o.MaxConns = int(limit - 256)
	}
	return latency.Latency(ctx, o, out)
}
