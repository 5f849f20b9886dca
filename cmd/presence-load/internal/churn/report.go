// Package churn is what the churning scenarios share: the pacer that
// puts joins on an absolute schedule, what the churners sent (asked of
// the workers that time their events) and the arrivals they report.
package churn

// Sent is when each churner's join and leave were sent, asking a worker
// for the arrival of their events: SendUS and LeaveUS per churner index,
// µs since the base (0: not expected).
type Sent struct {
	SendUS  []int64 `json:"send_us"`
	LeaveUS []int64 `json:"leave_us"`
	// The room seq of each churner's online and offline (from NATS; 0:
	// unknown), to tell an event that came inside a resync from one that
	// went missing.
	OnSeq  []uint64 `json:"on_seq"`
	OffSeq []uint64 `json:"off_seq"`
}

// Arrivals are the churners' events as the connections that time them
// read them (a worker's answer to Sent), or the sum over workers (Add).
type Arrivals struct {
	On         []int64 `json:"on,omitempty"`  // join sent -> online read, µs
	Off        []int64 `json:"off,omitempty"` // leave sent -> offline read, µs
	OnNever    int     `json:"on_never"`
	OnResynced int     `json:"on_resynced"`
	OffNever   int     `json:"off_never"`
	OffResync  int     `json:"off_resynced"`
	LostConn   int     `json:"lost_conn"` // expected at a connection the node dropped (counted apart)
	Conns      int     `json:"conns"`
	Expects    int     `json:"expects"`
	// Worst is, for churner i, its slowest join sent -> online read over
	// the connections that time it (0: none read it): where in the
	// churn the slow ones were.
	Worst []int64 `json:"worst,omitempty"`
}

// Add adds b's arrivals to a's.
func (a *Arrivals) Add(b Arrivals) {
	a.On = append(a.On, b.On...)
	a.Off = append(a.Off, b.Off...)
	a.OnNever += b.OnNever
	a.OnResynced += b.OnResynced
	a.OffNever += b.OffNever
	a.OffResync += b.OffResync
	a.LostConn += b.LostConn
	a.Conns += b.Conns
	a.Expects += b.Expects
	if len(b.Worst) > len(a.Worst) {
		a.Worst = append(a.Worst, make([]int64, len(b.Worst)-len(a.Worst))...)
	}
	for i, v := range b.Worst {
		a.Worst[i] = max(a.Worst[i], v)
	}
}
