package webhook

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
)

// DeadLetterStream keeps the batches that were not delivered within
// their retry horizon: the body exactly as it was sent, with headers
// saying where it was going and why it stopped.
const DeadLetterStream = "PRESENCE_webhooks_dlq"

// DefaultDeadLetterMaxAge is how long dead letters are kept.
const DefaultDeadLetterMaxAge = 7 * 24 * time.Hour

// Dead-letter headers.
const (
	HeaderDLEndpoint = "Webhook-Endpoint"
	HeaderDLSource   = "Webhook-Source"
	HeaderDLID       = "Webhook-Id"
	HeaderDLAttempts = "Webhook-Attempts"
	HeaderDLLast     = "Webhook-Last-Failure"
)

func deadLetterConfig(maxAge time.Duration, replicas int, storage jetstream.StorageType) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        DeadLetterStream,
		Description: "presence webhooks: batches not delivered within their retry horizon",
		Subjects:    []string{bus.WebhookDeadLetterFilter},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      maxAge,
		Replicas:    replicas,
		Storage:     storage,
		Duplicates:  bus.DuplicateWindow,
	}
}

// publishDeadLetter stores batch b of lane l once: its Nats-Msg-Id is the
// lane and the webhook-id, so a dispatcher that stores it again after a
// crash (inside the duplicate window) stores nothing new.
func publishDeadLetter(ctx context.Context, js jetstream.JetStream, l LaneID, b *batch) error {
	m := nats.NewMsg(bus.WebhookDeadLetterSubject(l.Endpoint, l.Source))
	m.Data = b.body
	m.Header.Set(jetstream.MsgIDHeader, l.String()+"/"+b.id)
	m.Header.Set(HeaderDLEndpoint, l.Endpoint)
	m.Header.Set(HeaderDLSource, l.Source)
	m.Header.Set(HeaderDLID, b.id)
	m.Header.Set(HeaderDLAttempts, strconv.Itoa(b.attempts))
	m.Header.Set(HeaderDLLast, b.last.class())
	if _, err := js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("webhook: dead letter %s %s: %w", l, b.id, err)
	}
	return nil
}
