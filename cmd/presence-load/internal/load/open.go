package load

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Tally tallies a batch of opens (a worker's answer to open carries it):
// how many opened, how many failed, the refusals among them by code, the
// first error and the time the batch took.
type Tally struct {
	Opened   int            `json:"opened"`
	Failed   int            `json:"failed"`
	FirstErr string         `json:"first_err,omitempty"`
	Codes    map[string]int `json:"codes,omitempty"`
	Took     time.Duration  `json:"took"`
}

// note counts one open that ended with err.
func (t *Tally) note(err error) {
	if err == nil {
		t.Opened++
		return
	}
	t.Failed++
	var re *Refusal
	if errors.As(err, &re) {
		if t.Codes == nil {
			t.Codes = map[string]int{}
		}
		t.Codes[re.Code]++
	}
	if t.FirstErr == "" {
		t.FirstErr = err.Error()
	}
}

// OpenEach calls open(k) for k from 0 to n-1, inflight at a time, until
// ctx ends, and tallies the errors they return. What an open makes is its
// own to keep (each k its own slot; anything shared under its own lock).
func OpenEach(ctx context.Context, n, inflight int, open func(k int) error) Tally {
	var t Tally
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(inflight, 1))
	start := time.Now()
	for k := range n {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := open(k)
			mu.Lock()
			t.note(err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Took = time.Since(start)
	return t
}
