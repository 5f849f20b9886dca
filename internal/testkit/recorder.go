package testkit

import "sync"

// Recorder keeps values handed to it from other goroutines (a NATS
// subscription's handler, a watcher's callback) in arrival order; safe
// for concurrent use.
type Recorder[T any] struct {
	mu sync.Mutex
	vs []T
}

// Add appends v.
func (r *Recorder[T]) Add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.vs = append(r.vs, v)
}

// All returns a copy of every value recorded.
func (r *Recorder[T]) All() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.vs...)
}

// Len returns how many values were recorded.
func (r *Recorder[T]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.vs)
}
