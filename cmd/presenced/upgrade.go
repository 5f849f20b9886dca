package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// runUpgradeCommand shows the region's data format and the formats of
// the holders whose lease runs; with --finish it switches the region to
// this release's format once none of them is of an older one (region/doc.go,
// "Upgrading"). A switch refused is exit code 1, the holders named.
func runUpgradeCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("presenced upgrade", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var redisSpec, prefix string
	var cluster, finish bool
	fs.StringVar(&redisSpec, "redis", "redis://127.0.0.1:6379", "regional Redis: a redis:// URL or host:port[,host:port...] (several: Redis Cluster)")
	fs.BoolVar(&cluster, "redis-cluster", false, "treat --redis as a Redis Cluster even with one address")
	fs.StringVar(&prefix, "redis-prefix", "presence", "prefix of the region's Redis keys, as the nodes'")
	fs.BoolVar(&finish, "finish", false, "switch the region to this release's data format (refused while a node of an older one holds a lease)")
	fs.Usage = groupedUsage(fs, commandIntro[fs.Name()], "")
	if err := parseFlags(fs, args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	rdb, err := newRedis(redisSpec, cluster)
	if err != nil {
		return err
	}
	defer rdb.Close()
	nop := region.SinkFunc(func(context.Context, []presence.Transition) (uint64, error) { return 0, nil })
	store, err := region.New(rdb, region.Options{Region: "upgrade", Prefix: prefix, Sink: nop})
	if err != nil {
		return &usageError{err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := store.FormatStatus(ctx)
	if err == nil && finish {
		before := st.Region
		st, err = store.FinishUpgrade(ctx)
		if err == nil && before != st.Region {
			fmt.Fprintf(stdout, "switched the region from format %d to %d: the nodes write it within a heartbeat, each session moves at its next one; the releases of format %d refuse the region from now on\n", before, st.Region, before)
		}
	}
	if st.Region != 0 {
		printFormatStatus(stdout, st)
	}
	var ue *region.UpgradeBlockedError
	if errors.As(err, &ue) || err == nil {
		return err
	}
	return fmt.Errorf("presenced upgrade: %w", err)
}

// printFormatStatus writes the region's format and its holders, one a line.
func printFormatStatus(w io.Writer, st region.FormatStatus) {
	fmt.Fprintf(w, "region format %d; this release reads up to %d\n", st.Region, st.Newest)
	for _, h := range st.Holders {
		fmt.Fprintf(w, "holder %s reads up to format %d, lease until %s\n", h.Name, h.Format, h.Until.UTC().Format(time.RFC3339))
	}
	switch b := st.Blocking(); {
	case st.Region == st.Newest:
		fmt.Fprintln(w, "nothing to switch: the region is in this release's format")
	case len(b) > 0:
		names := make([]string, len(b))
		for i, h := range b {
			names[i] = h.Name
		}
		fmt.Fprintf(w, "not ready: %s of an older format hold a lease\n", strings.Join(names, ", "))
	default:
		fmt.Fprintf(w, "ready: no holder of an older format is left; presenced upgrade --finish switches to format %d\n", st.Newest)
	}
}
