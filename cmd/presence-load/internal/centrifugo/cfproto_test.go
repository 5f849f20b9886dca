package centrifugo

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/cmd/presence-load/internal/churn"
	"github.com/presence-dev/presence/cmd/presence-load/internal/load"
	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
)

// Messages as Centrifugo v6 writes them (protocol v0.19, JSON).
const (
	cfJoinMsg  = `{"push":{"channel":"big1","join":{"info":{"user":"c1-0-3","client":"8a1c0c4e-2f7b-4e53-9b1e-1f0f3c2d4e5f"}}}}`
	cfLeaveMsg = `{"push":{"channel":"big1","leave":{"info":{"user":"c1-0-3","client":"8a1c0c4e-2f7b-4e53-9b1e-1f0f3c2d4e5f"}}}}`
)

func TestCfLinesSplitsNewlineDelimitedFrames(t *testing.T) {
	frame := []byte(cfJoinMsg + "\n{}\n" + cfLeaveMsg + "\n{\"id\":2,\"subscribe\":{}}\n")
	var got []string
	n := cfLines(frame, func(line []byte) { got = append(got, cfClassify(line)) })
	want := []string{cfJoin, cfPing, cfLeave, cfReply}
	if n != 4 || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("got %d %v, want %v", n, got, want)
	}
	// One message, no newline; empty lines and \r\n skipped.
	if n := cfLines([]byte(cfJoinMsg), nil); n != 1 {
		t.Fatalf("single message: %d", n)
	}
	if n := cfLines([]byte("\n\n{}\r\n\n"), nil); n != 1 {
		t.Fatalf("blank lines: %d", n)
	}
	if n := cfLines(nil, nil); n != 0 {
		t.Fatalf("empty frame: %d", n)
	}
}

func TestCfClassify(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`{}`, cfPing},
		{`{"id":1,"connect":{"client":"x","version":"0.0.0 OSS","ping":25,"pong":true}}`, cfReply},
		{`{"id":12,"subscribe":{}}`, cfReply},
		{`{"id":3,"error":{"code":103,"message":"permission denied"}}`, cfErrReply},
		{cfJoinMsg, cfJoin},
		{cfLeaveMsg, cfLeave},
		{`{"push":{"channel":"big1","pub":{"data":{"join":1}}}}`, cfPub},
		// A channel whose name holds quotes and the word join.
		{`{"push":{"channel":"a\"join\":x","leave":{"info":{"user":"u"}}}}`, cfLeave},
		{`{"push":{"channel":"big1","unsubscribe":{"code":2500}}}`, cfPushElse},
		{`{"push":{"disconnect":{"code":3008,"reason":"slow"}}}`, cfPushElse},
		{`{"id":,"x":1}`, cfBad},
		{`{"push":{"channel":"big1"}}`, cfBad},
		{`[1,2]`, cfBad},
	} {
		if got := cfClassify([]byte(c.line)); got != c.want {
			t.Errorf("%s: %q, want %q", c.line, got, c.want)
		}
	}
}

func TestCfJoinLeave(t *testing.T) {
	k, ch, u, err := cfJoinLeave([]byte(cfJoinMsg))
	if err != nil || k != cfJoin || ch != "big1" || u != "c1-0-3" {
		t.Fatalf("join: %q %q %q %v", k, ch, u, err)
	}
	k, _, u, err = cfJoinLeave([]byte(cfLeaveMsg))
	if err != nil || k != cfLeave || u != "c1-0-3" {
		t.Fatalf("leave: %q %q %v", k, u, err)
	}
	for _, bad := range []string{`{"id":1,"subscribe":{}}`, `{"push":{"channel":"c","pub":{}}}`, `{`} {
		if _, _, _, err := cfJoinLeave([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestCfErrText(t *testing.T) {
	var m cfMsg
	if m.errText() != "" {
		t.Fatal("no error")
	}
	m.Error = &struct {
		Code    uint32 `json:"code"`
		Message string `json:"message"`
	}{103, "permission denied"}
	if m.errText() != "103 permission denied" {
		t.Fatal(m.errText())
	}
}

func TestCfTrackAccounting(t *testing.T) {
	tr := newCfTrack("big1", "c1-0-", 4)
	tr.see(cfJoin, "big1", "m1-7", 50)     // a member: counted, not timed
	tr.see(cfJoin, "big1", "c1-0-0", 1100) // churner 0 joins
	tr.see(cfJoin, "big1", "c1-0-0", 1200) // pushed twice
	tr.see(cfLeave, "big1", "c1-0-0", 3500)
	tr.see(cfJoin, "big1", "c1-0-1", 1400) // churner 1: no leave seen
	tr.see(cfJoin, "big1", "c1-0-9", 1500) // out of range
	tr.see(cfJoin, "other", "c1-0-2", 1500)
	// Churner 2's join never came; churner 3's subscribe was not answered.
	req := &churn.Sent{SendUS: []int64{1000, 1000, 1000, 0}, LeaveUS: []int64{3000, 3000, 3000, 0}}
	var out cfReport
	tr.report(req, false, &out)
	if out.Conns != 1 || out.Expects != 3 {
		t.Fatalf("conns %d expects %d", out.Conns, out.Expects)
	}
	if len(out.On) != 2 || out.On[0] != 100 || out.On[1] != 400 || out.OnNever != 1 {
		t.Fatalf("on %v never %d", out.On, out.OnNever)
	}
	if len(out.Off) != 1 || out.Off[0] != 500 || out.OffNever != 2 {
		t.Fatalf("off %v never %d", out.Off, out.OffNever)
	}
	if out.Dups != 1 || out.Foreign != 2 {
		t.Fatalf("dups %d foreign %d", out.Dups, out.Foreign)
	}
	if tr.joins != 5 || tr.leaves != 1 {
		t.Fatalf("joins %d leaves %d (the other channel's not counted)", tr.joins, tr.leaves)
	}
	// At a connection Centrifugo closed, what is missing counts apart.
	var lost cfReport
	tr.report(req, true, &lost)
	if lost.OnNever != 0 || lost.LostConn != 1 || lost.OffNever != 0 {
		t.Fatalf("lost: %+v", lost)
	}
	var sum cfReport
	sum.add(out)
	sum.add(lost)
	if sum.Conns != 2 || sum.Expects != 6 || len(sum.On) != 4 || sum.Dups != 2 {
		t.Fatalf("add: %+v", sum)
	}
	// The latencies enter the same figures as bigroom's.
	line := measure.LatencyLine(measure.ToDurations(out.On), out.OnNever)
	if !strings.Contains(line, "1 never seen") || !strings.Contains(line, "p50 "+measure.FmtDur(400*time.Microsecond)) {
		t.Fatal(line)
	}
}

func TestCfFillPushes(t *testing.T) {
	for n, want := range map[int]int64{0: 0, 1: 0, 2: 1, 3: 3, 15000: 112492500} {
		if got := cfFillPushes(n); got != want {
			t.Errorf("%d: %d, want %d", n, got, want)
		}
	}
}

func TestCfCommands(t *testing.T) {
	if got := string(cfSubscribeCmd(2, `r"1`, true)); got != `{"id":2,"subscribe":{"channel":"r\"1","join_leave":true}}` {
		t.Fatal(got)
	}
	if got := string(cfSubscribeCmd(2, "r", false)); got != `{"id":2,"subscribe":{"channel":"r"}}` {
		t.Fatal(got)
	}
	if got := string(cfUnsubscribeCmd(3, "r")); got != `{"id":3,"unsubscribe":{"channel":"r"}}` {
		t.Fatal(got)
	}
	if got := string(cfConnectCmd(1, "t")); got != `{"id":1,"connect":{"token":"t","name":"presence-load"}}` {
		t.Fatal(got)
	}
}

func TestCfAwait(t *testing.T) {
	ch := make(chan cfMsg, 4)
	ch <- cfMsg{ID: 1}
	ch <- cfMsg{ID: 2}
	if m, err := cfAwait(ch, 2, time.Second); err != nil || m.ID != 2 {
		t.Fatalf("%+v %v", m, err)
	}
	bad := cfMsg{ID: 3}
	bad.Error = &struct {
		Code    uint32 `json:"code"`
		Message string `json:"message"`
	}{103, "permission denied"}
	ch <- bad
	_, err := cfAwait(ch, 3, time.Second)
	var re *load.Refusal
	if !errors.As(err, &re) || re.Code != "103" || re.Msg != "permission denied" {
		t.Fatal(err)
	}
	if _, err := cfAwait(ch, 4, 10*time.Millisecond); err == nil {
		t.Fatal("no timeout")
	}
	close(ch)
	if _, err := cfAwait(ch, 4, time.Second); err == nil {
		t.Fatal("closed: no error")
	}
}
