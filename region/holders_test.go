package region

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// Entries split at the first byte outside the id alphabet, in Go and in
// Lua alike, whatever the code's length and bytes.
func TestEntryParsing(t *testing.T) {
	rdb, _ := testredis.Client(t)
	lib, err := luaFS.ReadFile("lua/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	parse := redis.NewScript(string(lib) + "\nlocal u, s, c = parse(ARGV[1])\nreturn {u, s, c, tok_sid(string.sub(ARGV[1], #u + 2))}")
	sid := "aZ09-_=@+~"
	for _, code := range []string{"", "!", "`", "\x80", "\xff", "#\xa0", "\xff\xfe", "!\"#", "\x80\x81\xff"} {
		for _, c := range []byte(code) {
			if isIDByte(c) || !strings.ContainsRune(codeBytes, rune(c)) && c < 0x80 {
				t.Fatalf("code %q: byte %q is no code byte", code, c)
			}
		}
		e := "u0000123:" + sid + code
		u, s, c, ok := splitEntry(e)
		if !ok || u != "u0000123" || s != sid || c != code {
			t.Fatalf("Go: %q -> %q %q %q %v", e, u, s, c, ok)
		}
		res, err := parse.Run(context.Background(), rdb, nil, e).StringSlice()
		if err != nil || len(res) != 4 || res[0] != "u0000123" || res[1] != sid || res[2] != code || res[3] != sid {
			t.Fatalf("Lua: %q -> %q %v", e, res, err)
		}
	}
	if len(codeBytes) != 144 || strings.ContainsAny(codeBytes[:16], ":|{} *?[]\\^") {
		t.Fatalf("code bytes %q", codeBytes)
	}
	// No code byte splits a member of the index u: tokens are split at
	// whitespace, as Redis's Lua sees it.
	split := redis.NewScript(string(lib) + "\nreturn index_sids('u', ARGV[1])")
	for i := 0; i < len(codeBytes); i++ {
		c := codeBytes[i : i+1]
		got, err := split.Run(context.Background(), rdb, nil, "u a"+c+" b"+c+c).StringSlice()
		if err != nil || len(got) != 2 || got[0] != "a"+c || got[1] != "b"+c+c {
			t.Fatalf("code %q: index tokens %q %v", c, got, err)
		}
	}
}

// A session whose id starts with another's is a session of its own: a
// claim of the shorter one by another store leaves the longer one with
// its holder.
func TestSessionIDPrefixes(t *testing.T) {
	rdb, _ := testredis.Client(t)
	ctx := context.Background()
	a, b := newStore(t, rdb, &collector{}), newStore(t, rdb, &collector{})
	touch(t, a, ref("r", "u", "t"), ref("r", "u", "tt"))
	touch(t, b, ref("r", "u", "x")) // b takes its code
	res, err := b.Claim(ctx, []presence.SessionRef{ref("r", "u", "t")})
	if err != nil || len(res.Taken) != 1 || res.Taken[0].Session != "t" {
		t.Fatalf("claim of t: %+v %v, want t taken", res, err)
	}
	res, err = a.Refresh(ctx, []presence.SessionRef{ref("r", "u", "t"), ref("r", "u", "tt")})
	if err != nil || len(res.Lost) != 1 || res.Lost[0].Session != "t" {
		t.Fatalf("refresh: %+v %v, want t lost and tt kept", res, err)
	}
	release(t, a, ref("r", "u", "t")) // not a's any more: nothing
	release(t, a, ref("r", "u", "tt"))
	if n, _ := rdb.ZCard(ctx, a.roomKeys("r").s).Result(); n != 3 {
		t.Fatalf("%d entries, want x and t of b and tt released", n)
	}
	if _, err := rdb.ZScore(ctx, a.roomKeys("r").s, "u:tt").Result(); err != nil {
		t.Fatalf("the released entry of tt: %v", err)
	}
	if _, err := rdb.ZScore(ctx, a.roomKeys("r").s, "u:t"+b.code()).Result(); err != nil {
		t.Fatalf("b's entry of t: %v", err)
	}
	if m := members(t, a, "r"); m["u"] != 3 {
		t.Fatalf("members %v, want u with three sessions", m)
	}
}

// registry reads a code's registry entry: nonce, lease end, free time.
func registry(tb testing.TB, rdb redis.UniversalClient, code string) (string, int64, int64) {
	tb.Helper()
	v, err := rdb.HGet(context.Background(), "presence:holders", code).Result()
	if err != nil {
		tb.Fatalf("registry entry of %q: %v", code, err)
	}
	f := strings.Split(v, "|")
	until, _ := strconv.ParseInt(f[1], 10, 64)
	free, _ := strconv.ParseInt(f[2], 10, 64)
	return f[0], until, free
}

// setRegistry writes a code's registry entry as another store would.
func setRegistry(tb testing.TB, rdb redis.UniversalClient, code, nonce string, until, free int64) {
	tb.Helper()
	v := nonce + "|" + strconv.FormatInt(until, 10) + "|" + strconv.FormatInt(free, 10) + "|x"
	if err := rdb.HSet(context.Background(), "presence:holders", code, v).Err(); err != nil {
		tb.Fatal(err)
	}
}

// A store's writes renew its lease; the quarantine follows the lease.
func TestHolderLeaseRenewal(t *testing.T) {
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	s.leaseLen = 2 * time.Second
	touch(t, s, ref("r", "u", "a"))
	nonce, until0, free := registry(t, rdb, s.code())
	if nonce != s.holding.nonce || free-until0 != s.holdQuarantine().Milliseconds() {
		t.Fatalf("registry: nonce %q free %d until %d, want ours and a quarantine after", nonce, free, until0)
	}
	code := s.code()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		touch(t, s, ref("r", "u", "a"))
		_, until, _ := registry(t, rdb, code)
		return testkit.AtLeast("the code's lease, renewed", until, until0+1)
	})
	if s.code() != code {
		t.Fatalf("code %q, was %q", s.code(), code)
	}
}

// A write past the lease's end is refused by Redis; the next renews the
// lease, keeping the code while the registry still names the store.
func TestHolderLeaseLapsedIsRenewed(t *testing.T) {
	rdb, _ := testredis.Client(t)
	ctx := context.Background()
	s := newStore(t, rdb, &collector{})
	touch(t, s, ref("r", "u", "a"))
	code := s.code()
	// The process stalled past its lease, unaware.
	s.holdMu.Lock()
	s.holding.until = redisNow(t, rdb).UnixMilli() - 1
	s.holding.renew = time.Now().Add(time.Hour)
	s.holdMu.Unlock()
	for _, err := range []error{
		func() error { _, err := s.Refresh(ctx, []presence.SessionRef{ref("r", "u", "a")}); return err }(),
	} {
		if !errors.Is(err, errNoLease) {
			t.Fatalf("write past the lease: %v, want it refused", err)
		}
	}
	res, err := s.Refresh(ctx, []presence.SessionRef{ref("r", "u", "a")})
	if err != nil || len(res.Lost) != 0 || s.code() != code {
		t.Fatalf("after renewal: %+v %v, code %q (was %q)", res, err, s.code(), code)
	}
	// Release and SetState are refused too.
	s.holdMu.Lock()
	s.holding.until = redisNow(t, rdb).UnixMilli() - 1
	s.holding.renew = time.Now().Add(time.Hour)
	s.holdMu.Unlock()
	if _, err := s.SetState(ctx, ref("r", "u", "a"), []byte(`{}`)); !errors.Is(err, errNoLease) {
		t.Fatalf("state past the lease: %v", err)
	}
	s.holdMu.Lock()
	s.holding.until = redisNow(t, rdb).UnixMilli() - 1
	s.holding.renew = time.Now().Add(time.Hour)
	s.holdMu.Unlock()
	if err := s.Release(ctx, ref("r", "u", "a")); !errors.Is(err, errNoLease) {
		t.Fatalf("release past the lease: %v", err)
	}
	if m := members(t, s, "r"); m["u"] != 1 {
		t.Fatalf("members %v: the refused writes changed something", m)
	}
}

// A store whose lapsed code went to another takes a new one; its
// sessions under the old code are lost to its refreshes.
func TestHolderLeaseLapsedCodeTaken(t *testing.T) {
	rdb, _ := testredis.Client(t)
	ctx := context.Background()
	s := newStore(t, rdb, &collector{})
	touch(t, s, ref("r", "u", "a"))
	old := s.code()
	now := redisNow(t, rdb).UnixMilli()
	setRegistry(t, rdb, old, "another", now+60000, now+120000)
	s.renewSoon()
	res, err := s.Refresh(ctx, []presence.SessionRef{ref("r", "u", "a")})
	if err != nil || s.code() == old || len(s.code()) != 1 {
		t.Fatalf("refresh: %v, code %q (was %q), want a new one", err, s.code(), old)
	}
	if len(res.Lost) != 1 {
		t.Fatalf("refresh: %+v, want the session under the old code lost", res)
	}
}

// A code is not given out again until its quarantine after the lease's
// end has passed, and is given out then.
func TestHolderQuarantine(t *testing.T) {
	rdb, _ := testredis.Client(t)
	a := newStore(t, rdb, &collector{})
	a.leaseLen = time.Second
	touch(t, a, ref("r", "u", "a"))
	code := a.code()
	_, until, free := registry(t, rdb, code)
	// a stops: its lease ends, its entries still live.
	waitRedisPast(t, rdb, time.UnixMilli(until+1))
	b := newStore(t, rdb, &collector{})
	touch(t, b, ref("r", "v", "b"))
	if b.code() == code {
		t.Fatalf("b got a's code %q inside the quarantine", code)
	}
	if n, _ := rdb.ZCount(context.Background(), a.roomKeys("r").s, strconv.FormatInt(free/1000, 10), "+inf").Result(); n != 0 {
		t.Fatalf("%d entries outlive the quarantine", n)
	}
	// Past the quarantine (moved forward here rather than waited out),
	// the code is the first free one again.
	now := redisNow(t, rdb).UnixMilli()
	setRegistry(t, rdb, code, a.holding.nonce, now-2, now-1)
	c := newStore(t, rdb, &collector{})
	touch(t, c, ref("r", "w", "c"))
	if c.code() != code {
		t.Fatalf("c got %q, want the freed %q", c.code(), code)
	}
}

// Codes run to two bytes once every one-byte code is busy.
func TestHolderCodesGrow(t *testing.T) {
	rdb, _ := testredis.Client(t)
	now := redisNow(t, rdb).UnixMilli()
	for i := 0; i < len(codeBytes); i++ {
		setRegistry(t, rdb, codeBytes[i:i+1], "n"+strconv.Itoa(i), now+60000, now+120000)
	}
	s := newStore(t, rdb, &collector{})
	touch(t, s, ref("r", "u", "a"))
	if want := codeBytes[:1] + codeBytes[:1]; s.code() != want {
		t.Fatalf("code %q, want %q", s.code(), want)
	}
	if m := members(t, s, "r"); m["u"] != 1 {
		t.Fatalf("members %v", m)
	}
}

// An entry that Extend keeps alive for a waiting client may outlive its
// code's quarantine (here the registry frees the code at once). The
// code's next holder then acts on it only for its own session: its
// release and refresh of other sessions leave it alone, and its claim
// of that very session takes it over silently, as its own.
func TestAnExtendedEntryOutlivingItsCodeStaysItsSession(t *testing.T) {
	ctx := context.Background()
	rdb, _ := testredis.Client(t)
	col := &collector{}
	a := newStore(t, rdb, col)
	touch(t, a, ref("r", "u", "s1"))
	code := a.code()
	// a dies; u's client waits at b, which keeps its session.
	b := newStore(t, rdb, col)
	if n, err := b.Extend(ctx, []presence.SessionRef{ref("r", "u", "s1")}); err != nil || n != 1 {
		t.Fatalf("Extend: %d, %v", n, err)
	}
	now := redisNow(t, rdb).UnixMilli()
	setRegistry(t, rdb, code, a.holding.nonce, now-2, now-1)
	c := newStore(t, rdb, col)
	touch(t, c, ref("r", "v", "s2"), ref("r", "w", "s3"))
	if c.code() != code {
		t.Fatalf("c got %q, want a's freed %q", c.code(), code)
	}
	release(t, c, ref("r", "v", "s2"))
	res, err := c.Refresh(ctx, []presence.SessionRef{ref("r", "w", "s3")})
	if err != nil || len(res.Lost) != 0 {
		t.Fatalf("c's refresh: lost %v, %v", res.Lost, err)
	}
	if m := members(t, c, "r"); m["u"] != 1 {
		t.Fatalf("u's kept session changed under c's release and refresh: members %v", m)
	}
	// u's client is admitted at c: the claim takes the entry back silently.
	if ts := touch(t, c, ref("r", "u", "s1")); len(ts) != 0 {
		t.Fatalf("c's claim of u's kept session announced %v", ts)
	}
	if m := members(t, c, "r"); m["u"] != 1 {
		t.Fatalf("members after the claim %v", m)
	}
	if on, off := col.Of(presence.Online, "r", "u"), col.Of(presence.Offline, "r", "u"); len(on) != 1 || len(off) != 0 {
		t.Fatalf("u's transitions: %d online, %d offline; want only its first online", len(on), len(off))
	}
}
