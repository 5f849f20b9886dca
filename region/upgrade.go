package region

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The switch of a region to a new data format (doc.go, "Upgrading"). A
// release of format N+1 runs beside the release of format N in a region
// of format N: it reads both and writes N. Once no store of the old
// release is left, an operator's FinishUpgrade (presenced upgrade
// --finish) moves the region's marker to N+1; within a heartbeat every
// store writes N+1, and the heartbeat rewrites each session it refreshes.
// The switch is an operator's step, not automatic, because it is the end
// of the rollback: before it the old release can take the region back,
// after it the old release refuses the region.
//
// How the region knows that no store of the old release is left: every
// store that writes holds a lease in the holder registry, which names the
// newest format it reads (hold.lua; releases that wrote none read 2). A
// store's Close ends its lease (unhold.lua); a store that died keeps it
// until it runs out (holdLease). The switch refuses while a lease of a
// holder that cannot read the new format runs. A store of this release
// also reads the marker again every heartbeat, and writes nothing more
// once it names a format it cannot read (pollFormat). The switch first
// bars the registry to older holders in the step that finds none of them
// holding a lease (fence.lua): a store that read the old marker just
// before the switch gets no lease after it (hold.lua), so it writes
// nothing in the old format once the region is in the new one.

// HolderFormat is one holder of the registry whose lease runs.
type HolderFormat struct {
	Code   string    // its holder code (bytes outside the id alphabet)
	Name   string    // its Options.Holder
	Format int       // the newest format it reads
	Until  time.Time // its lease's end
}

// FormatStatus is a region's format and its holders, for the switch.
type FormatStatus struct {
	Region  int            // the format the region is in, which its stores write
	Newest  int            // the newest format this release reads
	Holders []HolderFormat // the holders whose lease runs
	At      time.Time      // the registry's clock when read
}

// Blocking returns the holders that keep the region from switching to
// this release's format: those whose lease runs and that cannot read it.
func (st FormatStatus) Blocking() []HolderFormat {
	var out []HolderFormat
	for _, h := range st.Holders {
		if h.Format < st.Newest {
			out = append(out, h)
		}
	}
	return out
}

// UpgradeBlockedError is a switch refused, or made while a store that
// cannot read the new format took a lease (it then writes nothing more
// once it reads the marker, within a heartbeat, if it is of a release that
// reads it again; stop it).
type UpgradeBlockedError struct {
	To       int
	Blocking []HolderFormat
	Switched bool // the marker moved; the holders registered meanwhile
}

func (e *UpgradeBlockedError) Error() string {
	var b strings.Builder
	if e.Switched {
		fmt.Fprintf(&b, "presence: the region switched to format %d, but holders that cannot read it took a lease meanwhile; stop them:", e.To)
	} else {
		fmt.Fprintf(&b, "presence: the region cannot switch to format %d while holders that cannot read it hold a lease (stop or replace them; a node that died frees its lease when it ends):", e.To)
	}
	for _, h := range e.Blocking {
		fmt.Fprintf(&b, " %s (format %d, lease until %s)", h.Name, h.Format, h.Until.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// FormatStatus reads the region's format marker and its holder registry.
func (s *Store) FormatStatus(ctx context.Context) (FormatStatus, error) {
	st := FormatStatus{Newest: newestFormat}
	v, err := s.rdb.Get(ctx, s.schemaKey()).Result()
	if err != nil {
		return st, &OpError{"format status", fmt.Errorf("the format marker %s: %w (a node's start writes it)", s.schemaKey(), err)}
	}
	n, ok := readable(v)
	if !ok {
		return st, &SchemaError{Found: v, Want: readsWhat(), Key: s.schemaKey()}
	}
	st.Region = n
	res, err := scriptRegistry.Run(ctx, s.rdb, []string{s.holdersKey()}).Slice()
	if err != nil || len(res) == 0 {
		return st, &OpError{"format status", fmt.Errorf("the holder registry: %v", err)}
	}
	now := num(res[0])
	st.At = time.UnixMilli(now)
	for i := 1; i+1 < len(res); i += 2 {
		if h, ok := parseHolder(str(res[i]), str(res[i+1])); ok && h.Until.UnixMilli() > now {
			st.Holders = append(st.Holders, h)
		}
	}
	return st, nil
}

// fence bars the holder registry to holders that cannot read this
// release's format (fence.lua), unless one of them holds a lease: it
// returns those.
func (s *Store) fence(ctx context.Context) ([]HolderFormat, error) {
	res, err := scriptFence.Run(ctx, s.rdb, []string{s.holdersKey()}, newestFormat).Slice()
	if err != nil || len(res) < 2 {
		return nil, fmt.Errorf("fencing the holder registry: %v %v", res, err)
	}
	if num(res[0]) == 1 {
		return nil, nil
	}
	var out []HolderFormat
	for i := 2; i+1 < len(res); i += 2 {
		if h, ok := parseHolder(str(res[i]), str(res[i+1])); ok {
			out = append(out, h)
		}
	}
	if len(out) == 0 { // an entry fence.lua reads and parseHolder does not
		return nil, fmt.Errorf("fencing the holder registry: refused by entries %v", res[2:])
	}
	return out, nil
}

// parseHolder reads a registry entry, "nonce|until|free|name" then
// "|format" (see hold.lua); with no format, the holder reads format 2.
func parseHolder(code, v string) (HolderFormat, bool) {
	f := strings.Split(v, "|")
	if len(f) < 4 {
		return HolderFormat{}, false
	}
	until, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return HolderFormat{}, false
	}
	h := HolderFormat{Code: code, Name: f[3], Format: 2, Until: time.UnixMilli(until)}
	if len(f) > 4 {
		if h.Format, err = strconv.Atoi(f[4]); err != nil {
			return HolderFormat{}, false
		}
	}
	return h, true
}

// FinishUpgrade switches the region to this release's format once no
// holder that cannot read it holds a lease, and returns the status it
// judged by. A region already in it is left as it is. After the switch
// the stores of this release write the new format within a heartbeat,
// and every session's state moves to it at its next heartbeat; a store
// of the release before refuses the region.
func (s *Store) FinishUpgrade(ctx context.Context) (FormatStatus, error) {
	st, err := s.FormatStatus(ctx)
	if err != nil || st.Region == newestFormat {
		return st, err
	}
	if b := st.Blocking(); len(b) > 0 {
		return st, &UpgradeBlockedError{To: newestFormat, Blocking: b}
	}
	// The check that counts is fence.lua's: it finds no lease of an older
	// holder and bars them from the registry in one step, so none that
	// read the old marker since the status above writes after the switch.
	if b, err := s.fence(ctx); err != nil || len(b) > 0 {
		if err != nil {
			return st, &OpError{"finish upgrade", err}
		}
		return st, &UpgradeBlockedError{To: newestFormat, Blocking: b}
	}
	from := strconv.Itoa(st.Region)
	prev, err := scriptSwitch.Run(ctx, s.rdb, []string{s.schemaKey()}, from, newestFormat).Text()
	if err != nil {
		return st, &OpError{"finish upgrade", err}
	}
	if prev != from {
		return st, &OpError{"finish upgrade", fmt.Errorf("the format marker changed meanwhile, to %q", prev)}
	}
	// A holder of a release before the fence that took a lease meanwhile
	// is named (its hold.lua knows no bar).
	after, err := s.FormatStatus(ctx)
	if err != nil {
		return st, err
	}
	if b := after.Blocking(); len(b) > 0 {
		return after, &UpgradeBlockedError{To: newestFormat, Blocking: b, Switched: true}
	}
	return after, nil
}
