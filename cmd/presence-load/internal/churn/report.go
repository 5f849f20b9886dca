// Package churn is what the churning scenarios share: the pacer that
// puts joins on an absolute schedule, and the request that asks a worker
// when each churner's events arrived.
package churn

// ReportReq asks for the arrival of churners' events: SendUS and LeaveUS
// per churner index, µs since the base (0: not expected).
type ReportReq struct {
	SendUS  []int64 `json:"send_us"`
	LeaveUS []int64 `json:"leave_us"`
	// The room seq of each churner's online and offline (from NATS; 0:
	// unknown), to tell an event that came inside a resync from one that
	// went missing.
	OnSeq  []uint64 `json:"on_seq"`
	OffSeq []uint64 `json:"off_seq"`
}
