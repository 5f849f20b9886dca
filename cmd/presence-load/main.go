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
//     against a fresh read of the room (internal/bigroom). Its connections live
//     in bigroom-worker child processes.
//   - centrifugo: the side by side with Centrifugo v6: a
//     channel of 15,000 subscribers with join_leave, filled, then churned
//     at increasing rates until Centrifugo breaks (internal/centrifugo). Its
//     connections live in centrifugo-worker child processes.
//   - reconnect: the reconnect storm, 200,000 sessions back within
//     a minute on one Redis, driven on the store by stand-ins for nodes
//     that use the node's own join limiter and extender (internal/reconnect).
//   - region: a region on a Redis Cluster driven on the store by
//     region-driver child processes standing in for nodes
//     (internal/regionload).
//   - cf-idle, cf-latency, versus: Centrifugo measured as idle and latency
//     measure a node, and the side by side table (internal/centrifugo).
//   - hog: busy-loops goroutines (a CPU tenant beside the node; latency
//     --hog N starts one as a child process).
//
// Requests are bounded in count and time and go only to the addresses
// given (loopback). Connections per run stay under --max-conns, itself
// under this process's open-files limit.
//
// The scenarios live in internal/, one package per family; what they
// share is there too: load (the shared flags, dialing, joining), measure
// (CPU, RSS, latency figures), worker (the protocol of the child
// processes), churn (the pacer), cli (flags as tagged struct fields).
// This file only dispatches.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/presence-dev/presence/cmd/presence-load/internal/bigroom"
	"github.com/presence-dev/presence/cmd/presence-load/internal/centrifugo"
	"github.com/presence-dev/presence/cmd/presence-load/internal/cli"
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

// own are the modes that read their own flags, and the child processes
// (which read requests on stdin: package worker).
var own = map[string]func(ctx context.Context, args []string, out io.Writer) error{
	"bigroom-worker": func(ctx context.Context, _ []string, out io.Writer) error {
		return bigroom.WorkerMain(ctx, os.Stdin, out)
	},
	"centrifugo-worker": func(ctx context.Context, _ []string, out io.Writer) error {
		return centrifugo.WorkerMain(ctx, os.Stdin, out)
	},
	"region": regionload.Run,
	"region-driver": func(ctx context.Context, args []string, out io.Writer) error {
		return regionload.DriverMain(ctx, args, os.Stdin, out)
	},
	"reconnect": reconnect.Run,
	"versus":    func(_ context.Context, args []string, out io.Writer) error { return centrifugo.Versus(args, out) },
}

// shared are the modes that take the shared flags: load.Options and the
// big-room ones (bigroom.BigOpts), which Centrifugo's runs mirror.
var shared = map[string]func(ctx context.Context, o load.Options, b bigroom.Options, out io.Writer) error{
	"idle":    nodeOnly(latency.Idle),
	"latency": nodeOnly(latency.Run),
	"sweep":   nodeOnly(latency.Sweep),
	"storm":   nodeOnly(latency.Storm),
	"hog":     nodeOnly(latency.Hog),
	"cf-latency": func(ctx context.Context, o load.Options, b bigroom.Options, out io.Writer) error {
		return centrifugo.Latency(ctx, o, b.NodePID, out)
	},
	"bigroom":    bigroom.Run,
	"centrifugo": centrifugo.Run,
	"cf-idle": func(ctx context.Context, o load.Options, b bigroom.Options, out io.Writer) error {
		return centrifugo.Idle(ctx, o, b.NodePID, out)
	},
}

// nodeOnly is a mode that takes none of the big-room flags.
func nodeOnly(f func(context.Context, load.Options, io.Writer) error) func(context.Context, load.Options, bigroom.Options, io.Writer) error {
	return func(ctx context.Context, o load.Options, _ bigroom.Options, out io.Writer) error {
		return f(ctx, o, out)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	mode := args[0]
	if f, ok := own[mode]; ok {
		load.RaiseFileLimit()
		return f(ctx, args[1:], out)
	}
	f, ok := shared[mode]
	if !ok {
		return errors.New(usage)
	}
	var o load.Options
	b := bigroom.DefaultOptions()
	given, err := cli.Parse(mode, args[1:], &o, &b)
	if err != nil {
		return err
	}
	o.Finish(mode, given)
	o.FileLimit = load.RaiseFileLimit()
	return f(ctx, o, b, out)
}
