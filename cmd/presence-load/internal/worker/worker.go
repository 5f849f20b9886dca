// Package worker is the one protocol between the load tool and its child
// processes (bigroom-worker, centrifugo-worker, region-driver): this same
// executable started with the child's mode, that holds what one process
// cannot (more connections than its open files, a node's share of a
// region's sessions).
//
// The parent writes requests to the child's stdin, one JSON line each,
// {"op":"…","body":…}; the child answers each in turn with one line on
// its stdout, {"ok":…} or {"err":"…"}. The op "close" is answered, then
// ends the child; so does the end of its stdin (the parent went away),
// and the kernel kills a child whose parent died.
package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// OpClose is the op that ends a child once answered.
const OpClose = "close"

// request and reply are the protocol's two lines.
type request struct {
	Op   string          `json:"op"`
	Body json.RawMessage `json:"body,omitempty"`
}

type reply struct {
	OK  json.RawMessage `json:"ok,omitempty"`
	Err string          `json:"err,omitempty"`
}

// Op answers one request of a child from its body.
type Op func(ctx context.Context, body json.RawMessage) (any, error)

// Handle is an Op that decodes the body into a T for f (a request without
// a body is refused: every op that takes one needs it).
func Handle[T any](f func(ctx context.Context, req T) (any, error)) Op {
	return func(ctx context.Context, body json.RawMessage) (any, error) {
		var req T
		if len(body) == 0 {
			return nil, errors.New("no body")
		}
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, fmt.Errorf("body: %w", err)
		}
		return f(ctx, req)
	}
}

// Do is an Op that takes no body and answers nothing but success.
func Do(f func()) Op {
	return func(context.Context, json.RawMessage) (any, error) {
		f()
		return struct{}{}, nil
	}
}

// Serve answers the requests read from in on out, one at a time, with
// ops, until close or the end of in. An op it does not know is answered
// with an error; close, if ops has no such op, only ends it.
func Serve(ctx context.Context, in io.Reader, out io.Writer, ops map[string]Op) error {
	dec := json.NewDecoder(bufio.NewReaderSize(in, 1<<20))
	bw := bufio.NewWriterSize(out, 1<<20)
	enc := json.NewEncoder(bw)
	for {
		var req request
		if err := dec.Decode(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		var rep reply
		res, err := call(ctx, ops, req)
		if err == nil {
			rep.OK, err = json.Marshal(res)
		}
		if err != nil {
			rep.Err = fmt.Sprintf("%s: %v", req.Op, err)
		}
		if err := enc.Encode(rep); err != nil {
			return err
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		if req.Op == OpClose {
			return nil
		}
	}
}

func call(ctx context.Context, ops map[string]Op, req request) (any, error) {
	op, ok := ops[req.Op]
	switch {
	case ok:
		return op(ctx, req.Body)
	case req.Op == OpClose:
		return struct{}{}, nil
	}
	return nil, errors.New("unknown op")
}

// Proc is a running child.
type Proc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	enc *json.Encoder
	dec *json.Decoder
	mu  sync.Mutex // one request at a time: replies come in order
}

// Start starts this executable with args, the child's mode first, its
// stderr on ours.
func Start(args ...string) (*Proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &Proc{cmd: cmd, in: in, enc: json.NewEncoder(in), dec: json.NewDecoder(bufio.NewReaderSize(out, 1<<20))}, nil
}

// Pid is the child's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Call sends op with body (nil: none) and decodes the reply's "ok" into
// res (nil: not read).
func (p *Proc) Call(op string, body, res any) error {
	req := request{Op: op}
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		req.Body = b
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.enc.Encode(req); err != nil {
		return fmt.Errorf("worker %d: %w", p.Pid(), err)
	}
	var rep reply
	if err := p.dec.Decode(&rep); err != nil {
		return fmt.Errorf("worker %d: %s: %w", p.Pid(), op, err)
	}
	if rep.Err != "" {
		return fmt.Errorf("worker %d: %s", p.Pid(), rep.Err)
	}
	if res == nil {
		return nil
	}
	return json.Unmarshal(rep.OK, res)
}

// Stop closes the child, waits up to 10 s for it to exit, then kills it.
func (p *Proc) Stop() {
	_ = p.Call(OpClose, nil, nil)
	_ = p.in.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// Each calls f for every child at once and joins their errors.
func Each(ps []*Proc, f func(i int, p *Proc) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(ps))
	for i, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i, p) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// CallWithin is Call bounded by d: past it the child is killed (its
// replies would no longer line up with the requests) and an error
// returned.
func (p *Proc) CallWithin(d time.Duration, op string, body, res any) error {
	done := make(chan error, 1)
	go func() { done <- p.Call(op, body, res) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("worker %d: no answer to %s in %v", p.Pid(), op, d)
	}
}
