package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/global"
)

// runAggregatorCommand runs one aggregator until ctx is done. Run two or
// more (one per region, say): one leads, the others take over.
func runAggregatorCommand(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("presenced aggregator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		natsURL, regions, cluster, logLevel, logFormat string
		cadence, grace, downAfter, dropAfter           time.Duration
		replicas                                       int
	)
	fs.StringVar(&natsURL, "nats", "nats://127.0.0.1:4222", "NATS server URL (the supercluster)")
	fs.DurationVar(&cadence, "cadence", global.DefaultCadence, "the regions' publication cadence")
	durationFlag(fs, &grace, "grace", "global offline grace (default 3 cadences)")
	durationFlag(fs, &downAfter, "down-after", "a region silent this long is held (default 5 cadences)")
	durationFlag(fs, &dropAfter, "drop-after", "a region silent this long is dropped: its users go offline, region_lost (default 60s)")
	fs.StringVar(&regions, "regions", "", "comma-separated regions expected to publish (optional)")
	fs.StringVar(&cluster, "stream-cluster", "", "NATS cluster that holds the global stream (optional)")
	fs.IntVar(&replicas, "replicas", 1, "replicas of the global stream and lease")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&logFormat, "log-format", "text", "text or json")
	if err := parseFlags(fs, args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	lg, err := newLogger(stderr, logLevel, logFormat)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(natsURL, nats.Name("presenced aggregator"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("nats %s: %w", natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := global.AggregatorConfig{
		NATS: nc, JetStream: js, Cadence: cadence, Grace: grace, DownAfter: downAfter, DropAfter: dropAfter,
		Replicas: replicas, Logger: lg,
	}
	if regions != "" {
		cfg.Regions = strings.Split(regions, ",")
	}
	if cluster != "" {
		cfg.Placement = &jetstream.Placement{Cluster: cluster}
	}
	a, err := global.NewAggregator(cfg)
	if err != nil {
		return &usageError{err.Error()}
	}
	if err := a.Start(ctx); err != nil {
		return err
	}
	lg.Info("presenced: aggregator running", "nats", natsURL, "cadence", cadence)
	<-ctx.Done()
	a.Close()
	lg.Info("presenced: aggregator stopped")
	return nil
}
