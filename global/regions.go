package global

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/presence-dev/presence/bus"
)

// What the global view does not hold itself, it asks the regions: last
// seen (each region records its own) and disconnects (each region's
// nodes close their own connections). The regions asked are the ones
// the aggregator has heard from, and those of Regions.

// regionAsk bounds one region's answer to a fanned-out request: a region
// cut off must not hold the answer of the others for the whole request
// timeout.
const regionAsk = time.Second

// knownRegions are the regions a fanned-out request goes to, sorted.
func (a *Aggregator) knownRegions() []string {
	a.mu.RLock()
	names := sortedKeys(a.c.regions)
	a.mu.RUnlock()
	for _, r := range a.cfg.Regions {
		if !slices.Contains(names, r) {
			names = append(names, r)
		}
	}
	slices.Sort(names)
	return names
}

// askRegions calls fn for every known region at once, each bounded by
// regionAsk, and returns each region's error (nil where it answered).
func (a *Aggregator) askRegions(ctx context.Context, fn func(context.Context, *bus.Client) error) ([]string, []error) {
	regions := a.knownRegions()
	errs := make([]error, len(regions))
	var wg sync.WaitGroup
	for i, r := range regions {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, regionAsk)
			defer cancel()
			errs[i] = fn(rctx, bus.NewClient(a.cfg.NATS, r))
		})
	}
	wg.Wait()
	return regions, errs
}

// LastSeen returns when the user was last active in any region: the
// latest of the regions' last seen. Regions that do not answer within
// regionAsk are left out (logged at debug: a region down would log every
// query); with none answering, no last seen is known. It never fails: a
// user's presence must not wait on what only the regions know.
func (a *Aggregator) LastSeen(ctx context.Context, user string) (time.Time, bool, error) {
	var (
		mu     sync.Mutex
		latest time.Time
	)
	regions, errs := a.askRegions(ctx, func(ctx context.Context, c *bus.Client) error {
		rep, err := c.LastSeen(ctx, user)
		if err == nil && rep.LastSeen != nil {
			mu.Lock()
			if rep.LastSeen.After(latest) {
				latest = *rep.LastSeen
			}
			mu.Unlock()
		}
		return err
	})
	for i, err := range errs {
		if err != nil {
			a.log.Debug("global: last seen: a region did not answer", "region", regions[i], "err", err)
		}
	}
	return latest, !latest.IsZero(), nil
}

// Disconnect asks every known region to disconnect the user (see
// bus.DisconnectRequest); Regions in the reply says how each took it. It
// fails (503) only when no region did.
func (a *Aggregator) Disconnect(ctx context.Context, req bus.DisconnectRequest) (bus.DisconnectReply, error) {
	if err := req.Check(time.Now()); err != nil {
		return bus.DisconnectReply{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, bus.DefaultRequestTimeout)
	defer cancel()
	regions, errs := a.askRegions(ctx, func(ctx context.Context, c *bus.Client) error {
		_, err := c.Disconnect(ctx, req)
		return err
	})
	rep := bus.DisconnectReply{Region: bus.GlobalRegion, User: req.User, Room: req.Room, Regions: make([]bus.RegionResult, len(regions))}
	var failed []string
	for i, r := range regions {
		rep.Regions[i].Region = r
		if err := errs[i]; err != nil {
			var qe *bus.QueryError
			if !errors.As(err, &qe) {
				qe = &bus.QueryError{Code: bus.CodeUnavailable, Description: err.Error()}
			}
			if qe.Code == bus.CodeBadRequest {
				return bus.DisconnectReply{}, qe // the region's rules refused it: so would the others'
			}
			rep.Regions[i].Error = &bus.ErrorReply{Code: qe.Code, Error: qe.Description}
			failed = append(failed, r)
		}
	}
	if len(failed) == len(regions) {
		names := strings.Join(regions, ", ")
		if names == "" {
			names = "none known"
		}
		return bus.DisconnectReply{}, &bus.QueryError{Code: bus.CodeUnavailable, Description: "disconnect: no region took it (regions: " + names + ")"}
	}
	if req.RevokeUntil != nil {
		until := req.RevokeUntil.UTC()
		rep.RevokedUntil = &until
	}
	return rep, nil
}
