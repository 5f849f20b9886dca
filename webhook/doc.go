// Package webhook delivers presence transitions to HTTP endpoints: the
// region streams and the global stream, read with durable JetStream
// consumers, signed as Standard Webhooks (webhook-id, webhook-timestamp,
// webhook-signature), batched, at least once and in seq order per room.
//
// The unit of work is a lane: one endpoint's delivery of one stream.
// A lane is delivered by one dispatcher at a time, the holder of its
// lease in the StateBucket KV bucket; dispatchers share the lanes fairly.
// Each lane has its own durable consumer (ConsumerName), its own order
// and one delivery in flight, so a slow or failing endpoint delays only
// itself. The core (core.go, core_batch.go) orders each room's events
// by (epoch, seq), forms batches and decides retries, dead letters and
// resync markers; it does no I/O. The lane (lane*.go) is its shell: it
// feeds it from the consumer, persists each room's position before it
// acknowledges, and posts the batches (attempt.go, transport.go).
//
// docs/WEBHOOKS.md is the contract for receivers and operators.
package webhook
