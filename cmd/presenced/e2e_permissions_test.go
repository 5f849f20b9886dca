package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// The configuration files a deployment copies: deploy/nats/eu.conf and
// us.conf (a two-region supercluster with JetStream), both including
// accounts.conf (the roles and their permissions).
var natsConfigs = []string{"../../deploy/nats/eu.conf", "../../deploy/nats/us.conf"}

// natsPasswords sets the passwords accounts.conf reads from the
// environment and returns them by role.
func natsPasswords(t *testing.T) map[string]string {
	pw := map[string]string{}
	for _, role := range []string{"SYS", "NODE_EU", "NODE_US", "AGGREGATOR", "READER", "ADMIN"} {
		pw[role] = "pw-" + strings.ToLower(role)
		t.Setenv("NATS_PASS_"+role, pw[role])
	}
	return pw
}

// denials collects the permission violations the server reports to one
// connection.
type denials struct {
	mu   sync.Mutex
	errs []string
}

func (d *denials) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
		d.mu.Lock()
		d.errs = append(d.errs, strings.ToLower(err.Error()))
		d.mu.Unlock()
	}
}

func (d *denials) has(op, subject string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if op == "subscribe" {
		op = "subscription"
	}
	want := fmt.Sprintf("permissions violation for %s to %q", op, subject)
	return slices.ContainsFunc(d.errs, func(e string) bool { return strings.Contains(e, strings.ToLower(want)) })
}

func (d *denials) all() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.errs...)
}

// roleURL is the client URL of cluster's server with a role's user.
func roleURL(sc *testnats.Configured, cluster, user, password string) string {
	return strings.Replace(sc.Server(cluster).ClientURL(), "nats://", "nats://"+user+":"+password+"@", 1)
}

func connectAs(t *testing.T, sc *testnats.Configured, cluster, user, password string) (*nats.Conn, *denials) {
	t.Helper()
	d := &denials{}
	nc, err := nats.Connect(roleURL(sc, cluster, user, password), nats.ErrorHandler(d.handler))
	if err != nil {
		t.Fatalf("connect %s as %s: %v", cluster, user, err)
	}
	t.Cleanup(nc.Close)
	return nc, d
}

var aggregatorHTTP = regexp.MustCompile(`msg="presenced: aggregator http" addr=(\S+)`)

// waitAggregatorOK waits for an aggregator process's /healthz to say ok.
func waitAggregatorOK(t *testing.T, p *proc) string {
	t.Helper()
	var addr string
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		select {
		case <-p.done:
			t.Fatalf("aggregator exited: %v\n%s", p.err, p.out.String())
		default:
		}
		if addr == "" {
			m := aggregatorHTTP.FindStringSubmatch(p.out.String())
			if m == nil {
				return errors.New("no http line in the aggregator's log yet")
			}
			addr = m[1]
		}
		var h struct{ Status string }
		if err := tryJSON("http://"+addr+"/healthz", &h); err != nil {
			return err
		}
		return testkit.Want("the aggregator's health", h.Status, "ok")
	})
	return addr
}

// The ready NATS configuration (deploy/nats) loads in real nats-servers
// as a two-region supercluster with JetStream, and each role can do its
// job with its own user: nodes of both regions and two aggregators give
// clients the global view, a reader follows transitions, queries every
// view and replays the streams, and no server reports a single denied
// operation. Then each role tries what it must not do, and the servers
// refuse it: above all, a region's credentials cannot publish for
// another region, nor write the global view.
func TestE2ENATSConfigurationGivesEachRoleItsJob(t *testing.T) {
	pw := natsPasswords(t)
	sc := testnats.StartConfigured(t, natsConfigs...)
	if nc, err := nats.Connect(sc.Server("eu").ClientURL()); err == nil {
		nc.Close()
		t.Fatal("a connection without credentials was accepted")
	}
	regions := map[string]*env{}
	for _, r := range []string{"eu", "us"} {
		rs := testredis.Start(t)
		regions[r] = &env{t: t, redis: rs.Addr, nats: roleURL(sc, r, "node-"+r, pw["NODE_"+strings.ToUpper(r)])}
	}
	var aggAddrs []string
	for _, cluster := range []string{"us", "eu"} {
		agg := regions[cluster].start([]string{"aggregator", "--nats", roleURL(sc, cluster, "aggregator", pw["AGGREGATOR"]),
			"--cadence", "300ms", "--regions", "eu,us", "--stream-cluster", "us", "--listen", "127.0.0.1:0"}, false)
		aggAddrs = append(aggAddrs, waitAggregatorOK(t, agg))
	}
	na := regions["eu"].startNodeIn("eu", "--global", "--global-cadence", "300ms")
	nb := regions["us"].startNodeIn("us", "--global", "--global-cadence", "300ms")

	reader, readerDenied := connectAs(t, sc, "eu", "reader", pw["READER"])
	var (
		mu     sync.Mutex
		events []presence.Transition
	)
	sub, err := bus.WatchRoom(reader, bus.GlobalRegion, "lobby", func(tr presence.Transition) {
		mu.Lock()
		events = append(events, tr)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	onlineSeen := func(user string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(events, func(tr presence.Transition) bool { return tr.User == user && tr.Kind == presence.Online })
	}

	alice := dial(t, na.addr, "alice", "tab")
	alice.join("lobby")
	bob := dial(t, nb.addr, "bob", "tab")
	bob.join("lobby")
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(testkit.Want("alice's global online read", onlineSeen("alice"), true), testkit.Want("bob's global online read", onlineSeen("bob"), true))
	})
	for seen := false; !seen; {
		f := alice.expect("event")
		ev := f["event"].(map[string]any)
		seen = ev["region"] == bus.GlobalRegion && ev["user"] == "bob" && ev["kind"] == "online"
	}

	// The reader queries every view and replays the streams.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gsnap, err := global.NewClient(reader).Snapshot(ctx, "lobby", 0, 10)
	if err != nil || gsnap.Total != 2 {
		t.Fatalf("the reader's global snapshot: %+v %v", gsnap, err)
	}
	esnap, err := bus.NewClient(reader, "eu").Snapshot(ctx, "lobby", 0, 10)
	if err != nil || esnap.Total != 1 || esnap.Members[0].User != "alice" {
		t.Fatalf("the reader's eu snapshot: %+v %v", esnap, err)
	}
	js, _ := jetstream.New(reader)
	replayed := make(chan presence.Transition, 16)
	rp, err := bus.Replay(ctx, js, "eu", "lobby", esnap, func(tr presence.Transition) { replayed <- tr })
	if err != nil {
		t.Fatalf("the reader's replay of PRESENCE_eu: %v", err)
	}
	defer rp.Stop()
	alice.send(map[string]any{"type": "state", "room": "lobby", "state": "away", "ref": "s"})
	select {
	case tr := <-replayed:
		if tr.Kind != presence.Update || tr.User != "alice" {
			t.Fatalf("replayed %+v, want alice's update", tr)
		}
	case <-ctx.Done():
		t.Fatal("the reader's replay delivered nothing")
	}
	oc, err := js.OrderedConsumer(ctx, global.StreamName, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("the reader's consumer of %s: %v", global.StreamName, err)
	}
	// A loaded machine can leave one fetch empty: read until the
	// deadline, and fail on an error or on nothing read by then.
	read := 0
	_ = testkit.Poll(20*time.Second, 0, func() error { // judged below
		batch, err := oc.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatalf("the reader's read of %s: %v", global.StreamName, err)
		}
		if read = len(collect(batch.Messages())); read == 0 {
			return errors.New("a fetch read nothing")
		}
		return nil
	})
	if read != 1 {
		t.Fatalf("the reader read %d messages of %s", read, global.StreamName)
	}

	// bob leaves: the leader stores his offline and purges his online.
	bob.send(map[string]any{"type": "leave", "room": "lobby", "ref": "l"})
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		mu.Lock()
		left := slices.ContainsFunc(events, func(tr presence.Transition) bool { return tr.User == "bob" && tr.Kind == presence.Offline })
		mu.Unlock()
		purged := false
		for _, a := range aggAddrs {
			purged = purged || metricLine("http://"+a+"/metrics", "presence_global_purges_total 1")
		}
		if !left || !purged {
			return fmt.Errorf("bob's global offline read: %v; his online purged by an aggregator: %v", left, purged)
		}
		return nil
	})

	if v := sc.Log().Lines("Violation"); len(v) > 0 || len(readerDenied.all()) > 0 {
		t.Fatalf("a role was denied part of its job:\n%s\n%v", strings.Join(v, "\n"), readerDenied.all())
	}

	// What each role must not do.
	forged := fmt.Sprintf(`{"v":1,"kind":"full","region":"us","gen":%d,"inst":"x","seq":1,"part":1,"parts":1,"rooms":[{"room":"lobby","set":{"ghost":["s"]}}]}`, uint64(1)<<62)
	for _, c := range []struct {
		user, role, op, subject string
	}{
		// A region speaks for itself only.
		{"node-eu", "NODE_EU", "publish", bus.SyncFullSubject("us")},
		{"node-eu", "NODE_EU", "publish", bus.SyncDeltaSubject("us")},
		{"node-eu", "NODE_EU", "publish", "presence-in.us.lobby.online.ghost"},
		{"node-eu", "NODE_EU", "publish", "presence-ctl.us.takeover"},
		{"node-eu", "NODE_EU", "publish", "$KV.PRESENCE_sync_us.publisher"},
		{"node-us", "NODE_US", "publish", bus.SyncFullSubject("eu")},
		// Nobody but the aggregators writes the global view, and nobody
		// publishes transitions past the streams.
		{"node-eu", "NODE_EU", "publish", "presence-sync.global.lobby.online.ghost"},
		{"node-eu", "NODE_EU", "publish", "presence.eu.lobby.online.ghost"},
		{"node-eu", "NODE_EU", "publish", "presence.global.lobby.online.ghost"},
		{"node-eu", "NODE_EU", "publish", "$JS.API.STREAM.DELETE.PRESENCE_eu"},
		{"node-eu", "NODE_EU", "publish", "$JS.API.STREAM.PURGE.PRESENCE_global"},
		// An aggregator writes the global view only, never a region's.
		{"aggregator", "AGGREGATOR", "publish", bus.SyncDeltaSubject("eu")},
		{"aggregator", "AGGREGATOR", "publish", "presence-in.eu.lobby.online.ghost"},
		{"aggregator", "AGGREGATOR", "publish", "presence.global.lobby.online.ghost"},
		{"aggregator", "AGGREGATOR", "publish", "$JS.API.STREAM.DELETE.PRESENCE_eu"},
		// A reader changes nothing.
		{"reader", "READER", "publish", "presence.eu.lobby.online.ghost"},
		{"reader", "READER", "publish", "presence-in.eu.lobby.online.ghost"},
		{"reader", "READER", "publish", bus.SyncFullSubject("eu")},
		{"reader", "READER", "publish", "presence-sync.global.lobby.online.ghost"},
		{"reader", "READER", "publish", "presence-ctl.eu.takeover"},
		{"reader", "READER", "publish", "presence-ctl.eu.disconnect"},
		{"reader", "READER", "publish", "presence-ctl.global.disconnect"},
		{"aggregator", "AGGREGATOR", "publish", "presence-ctl.eu.drop"},
		{"reader", "READER", "publish", "$JS.API.STREAM.DELETE.PRESENCE_eu"},
		{"reader", "READER", "publish", "$JS.API.STREAM.PURGE.PRESENCE_global"},
		{"reader", "READER", "publish", "$KV.PRESENCE_global_lease.aggregator"},
		{"reader", "READER", "subscribe", "presence-sync.>"},
		{"reader", "READER", "subscribe", "presence-api.eu.members"},
	} {
		nc, d := connectAs(t, sc, "eu", c.user, pw[c.role])
		if c.op == "publish" {
			if err := nc.Publish(c.subject, []byte(forged)); err != nil {
				t.Fatal(err)
			}
		} else if _, err := nc.Subscribe(c.subject, func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			if !d.has(c.op, c.subject) {
				return fmt.Errorf("%s not refused %s on %s (denials so far: %v)", c.user, c.op, c.subject, d.all())
			}
			return nil
		})
	}
	// Nothing forged reached the global view.
	gsnap, err = global.NewClient(reader).Snapshot(ctx, "lobby", 0, 10)
	if err != nil || gsnap.Total != 1 || slices.ContainsFunc(gsnap.Members, func(m presence.Member) bool { return m.User == "ghost" }) {
		t.Fatalf("the global view after the refusals: %+v %v", gsnap, err)
	}
}

// metricLine reports whether the exposition at url has the line.
func metricLine(url, line string) bool {
	r, err := http.Get(url)
	if err != nil {
		return false
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return slices.Contains(strings.Split(string(b), "\n"), line)
}

func collect(ch <-chan jetstream.Msg) []jetstream.Msg {
	var out []jetstream.Msg
	for m := range ch {
		out = append(out, m)
	}
	return out
}
