package region

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Holder codes. A store's session entries end with its holder code,
// "user:session" then the code, with no separator: ids hold only the
// bytes of presence/id.go, and codes only bytes outside that alphabet, so
// a session id ends at its entry's first byte that is not an id byte. A
// released entry has no code. Codes are leased from the region's registry
// (hold.lua) and come back for reuse, so they stay one byte long: 144
// stores of a region at once, before any needs two bytes.
//
// Safety: two stores that can both write never share a code.
//   - A store writes under its code only with a lease: every script that
//     writes an entry of the code (touch, release, state) gets the lease's
//     end and refuses to run past it (Redis's clock, as the registry's).
//   - The registry gives a code to another store only after the lease's
//     end plus the holder's quarantine (holdQuarantine), by which time
//     every entry it wrote has expired and no read lists it any more; its
//     tombstones (a TTL) have expired too.
//   - A store whose lease lapsed (paused, cut off, or Redis lost the
//     registry) keeps its code if the registry still names it or no one,
//     else it takes another: its sessions under the old one are long
//     expired, and its refreshes report them lost.
//   - An entry that does outlive the quarantine (Extend keeps a waiting
//     client's entry, whoever holds it) is one its old holder can no
//     longer write: the new holder of the code only ever acts on it for
//     the same session, as its own, which it then is
//     (TestAnExtendedEntryOutlivingItsCodeStaysItsSession).
//
// Residual risk: on a cluster, if the registry's master alone loses its
// data while its holders' entries live on in other slots, a store that
// starts before they renew may take a code in use. Renewals come every
// holdRenew, and a store whose incarnation check sees a data loss renews
// at once (sawIncarnation).

// codeBytes are the one-byte codes in order of preference: the printable
// ASCII bytes outside the id alphabet that no key, index or pattern gives
// a meaning to (not ':' '|' ' ' '{' '}' nor the glob bytes * ? [ ] \ ^),
// then the bytes 0x80 to 0xff. Longer codes are made of the same bytes.
var codeBytes = func() string {
	b := []byte("!\"#$%&'(),./;<>`")
	for c := 0x80; c <= 0xff; c++ {
		b = append(b, byte(c))
	}
	return string(b)
}()

// isIDByte reports whether c may appear in an id (presence/id.go).
func isIDByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_=@+~", c) >= 0
}

// splitEntry splits an entry of s, "user:session" then the holder code
// (none for a released entry).
func splitEntry(e string) (user, session, code string, ok bool) {
	user, rest, ok := strings.Cut(e, ":")
	i := 0
	for i < len(rest) && isIDByte(rest[i]) {
		i++
	}
	return user, rest[:i], rest[i:], ok
}

// Lease timing. A lease lasts holdLease and is renewed by the writes of
// the store once holdRenew has passed since the last renewal: a store
// loses its code only after the registry has been out of its reach for
// three quarters of holdLease.
const (
	holdLease = 2 * time.Minute
	holdRenew = holdLease / 4
)

// holdQuarantine is how long after its holder's lease ends a code stays
// unused. The holder's last write ran by the lease's end (plus the skew
// between the clocks of two Redis masters on a cluster, a second here);
// its entries expire a TTL after, rounded up to a second; reads list an
// entry for the read slack past its expiry, and after an outage for the
// hold on top; tombstones last a TTL. A released entry has no code.
func (s *Store) holdQuarantine() time.Duration {
	return s.t.SessionTTL + time.Second + s.readSlack() + s.t.OutageHold() + time.Second
}

// errNoLease is a write refused because the store's lease has ended
// (see hold.lua): the next write takes a code again.
var errNoLease = errors.New("presence: this store's holder lease has ended")

// leaseErr is the prefix of the error reply of a script refusing a write
// past the caller's lease (lease_ok in lib.lua).
const leaseErr = "PRESENCE_LEASE"

// holding is a store's code and lease.
type holding struct {
	nonce   string    // this store instance's, in the registry
	code    string    // '' until the first write
	until   int64     // the lease's end, Redis ms
	expires time.Time // the lease's end by the local clock, never later than until
	renew   time.Time // renew from then on
}

func newNonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// holdersKey is the region's holder registry.
func (s *Store) holdersKey() string { return s.opt.Prefix + ":holders" }

// hold returns the code to write under and its lease's end (Redis ms),
// taking or renewing the lease when due. If a renewal fails while the
// lease still runs, the writes go on under it; the scripts refuse them
// once it has ended.
func (s *Store) hold(ctx context.Context) (string, int64, error) {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	h := &s.holding
	now := time.Now()
	s.pollFormat(ctx, now)
	if se := s.badFormat.Load(); se != nil {
		return "", 0, se
	}
	if h.code != "" && now.Before(h.renew) {
		return h.code, h.until, nil
	}
	res, err := scriptHold.Run(ctx, s.rdb, []string{s.holdersKey()}, h.nonce, h.code,
		ms(s.leaseLen), ms(s.holdQuarantine()), s.opt.Holder, codeBytes, newestFormat).Slice()
	if se := s.barred(err); se != nil {
		return "", 0, se
	}
	if err != nil || len(res) != 3 {
		if h.code != "" && now.Before(h.expires) {
			s.log.Warn("presence: holder lease not renewed; writing under it until it ends", "region", s.opt.Region, "err", err)
			return h.code, h.until, nil
		}
		if err == nil {
			err = fmt.Errorf("malformed reply %v", res)
		}
		return "", 0, fmt.Errorf("holder code: %w", err)
	}
	code, until, rnow := str(res[0]), num(res[1]), num(res[2])
	if h.code != "" && code != h.code {
		s.log.Warn("presence: holder lease lapsed and the code was taken; this store writes under a new one", "region", s.opt.Region)
	}
	h.code, h.until = code, until
	h.expires = now.Add(time.Duration(until-rnow) * time.Millisecond)
	h.renew = now.Add(s.leaseLen / 4)
	return code, until, nil
}

// formatErr is the prefix of hold.lua's refusal of a lease to a holder
// that cannot read the format the region switched to (fence.lua).
const formatErr = "PRESENCE_FORMAT"

// barred turns hold.lua's refusal into the SchemaError every later write
// returns: the region switched to a format this store cannot read, and
// it writes nothing more, even under a lease it still has.
func (s *Store) barred(err error) *SchemaError {
	if err == nil {
		return nil
	}
	_, rest, ok := strings.Cut(err.Error(), formatErr+" ")
	if !ok {
		return nil
	}
	found, _, _ := strings.Cut(rest, " ")
	se := &SchemaError{Found: found, Want: readsWhat(), Key: s.holdersKey()}
	if s.badFormat.CompareAndSwap(nil, se) {
		s.log.Error("presence: the region switched to a format this release cannot read; this store writes nothing more", "region", s.opt.Region, "err", se)
	}
	return s.badFormat.Load()
}

// leaseEnded makes the next write renew the lease (or take a new code)
// when err is a script's refusal of a write past it, and says so.
func (s *Store) leaseEnded(err error) bool {
	if err == nil || !strings.Contains(err.Error(), leaseErr) {
		return false
	}
	s.renewSoon()
	return true
}

// renewSoon makes the next write renew the lease first.
func (s *Store) renewSoon() {
	s.holdMu.Lock()
	s.holding.renew = time.Time{}
	s.holdMu.Unlock()
}

// unhold ends the store's lease now (unhold.lua), if it has one; the
// next write takes it again. A failure leaves the lease to run out.
func (s *Store) unhold(ctx context.Context) {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	h := &s.holding
	if h.code == "" {
		return
	}
	if err := scriptUnhold.Run(ctx, s.rdb, []string{s.holdersKey()}, h.nonce, h.code, ms(s.holdQuarantine())).Err(); err != nil {
		s.log.Warn("presence: holder lease not ended at close; it runs out", "region", s.opt.Region, "err", err)
		return
	}
	h.until, h.expires, h.renew = 0, time.Time{}, time.Time{}
}

// code is the store's holder code, ” before its first write.
func (s *Store) code() string {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	return s.holding.code
}
