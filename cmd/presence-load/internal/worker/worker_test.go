package worker

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// The test binary is its own child: started with WORKER_TEST_CHILD set,
// it serves testOps and exits, as a load tool child would.
func TestMain(m *testing.M) {
	if os.Getenv("WORKER_TEST_CHILD") == "1" {
		if err := Serve(context.Background(), os.Stdin, os.Stdout, testOps()); err != nil {
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type sum struct {
	A, B int
}

func testOps() map[string]Op {
	n := 0
	return map[string]Op{
		"add":   Handle(func(_ context.Context, s sum) (any, error) { return s.A + s.B, nil }),
		"count": Do(func() { n++ }),
		"n":     func(context.Context, json.RawMessage) (any, error) { return n, nil },
		"fail":  func(context.Context, json.RawMessage) (any, error) { return nil, errors.New("refused") },
		"slow": func(context.Context, json.RawMessage) (any, error) {
			time.Sleep(time.Minute)
			return nil, nil
		},
	}
}

func start(t *testing.T) *Proc {
	t.Helper()
	t.Setenv("WORKER_TEST_CHILD", "1")
	// A race-enabled child otherwise sleeps a second at exit.
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	p, err := Start("child")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestChildAnswersInOrder(t *testing.T) {
	p := start(t)
	defer p.Stop()
	var got int
	if err := p.Call("add", sum{2, 3}, &got); err != nil || got != 5 {
		t.Fatalf("add: %d, %v; want 5", got, err)
	}
	for range 3 {
		if err := p.Call("count", nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Call("n", nil, &got); err != nil || got != 3 {
		t.Fatalf("n: %d, %v; want 3: the child keeps its state between requests", got, err)
	}
}

func TestChildErrors(t *testing.T) {
	p := start(t)
	defer p.Stop()
	for _, c := range []struct {
		op   string
		body any
		want string
	}{
		{"fail", nil, "fail: refused"},
		{"nope", nil, "nope: unknown op"},
		{"add", nil, "add: no body"},
		{"add", "not an object", "add: body:"},
	} {
		err := p.Call(c.op, c.body, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.op, err, c.want)
		}
	}
	// An error does not end the child.
	var got int
	if err := p.Call("add", sum{1, 1}, &got); err != nil || got != 2 {
		t.Fatalf("add after errors: %d, %v", got, err)
	}
}

func TestCloseEndsTheChild(t *testing.T) {
	p := start(t)
	if err := p.Call(OpClose, nil, nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("child exited with %v after close", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("child still running 10 s after close")
	}
}

func TestCallWithinKillsAStuckChild(t *testing.T) {
	p := start(t)
	defer p.Stop()
	t0 := time.Now()
	err := p.CallWithin(200*time.Millisecond, "slow", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "no answer to slow") {
		t.Fatalf("CallWithin: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("CallWithin returned after %v", d)
	}
}

func TestEachJoinsErrors(t *testing.T) {
	ps := []*Proc{start(t), start(t)}
	defer func() {
		for _, p := range ps {
			p.Stop()
		}
	}()
	res := make([]int, len(ps))
	if err := Each(ps, func(i int, p *Proc) error { return p.Call("add", sum{i, 10}, &res[i]) }); err != nil {
		t.Fatal(err)
	}
	if res[0] != 10 || res[1] != 11 {
		t.Fatalf("results %v", res)
	}
	err := Each(ps, func(i int, p *Proc) error {
		if i == 1 {
			return p.Call("fail", nil, nil)
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Each: %v", err)
	}
}
