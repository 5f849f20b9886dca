package global

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The aggregator reads the global stream with batched direct gets, never
// with a consumer. A direct get is answered by the stream's own servers;
// creating a consumer needs the JetStream meta leader, which a partition
// of a two-cluster supercluster leaves on neither side. So the side that
// holds the stream keeps reading (and writing) it through a partition.

// directBatch is the most messages one direct get request returns.
const directBatch = 1000

// storedMsg is one message of a stream as a direct get returns it.
type storedMsg struct {
	subject string
	seq     uint64
	at      time.Time
	data    []byte
}

// apiPrefix is the JetStream API prefix js sends its requests on.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return jetstream.DefaultAPIPrefix
}

// readStream calls fn with every message of stream whose subject matches
// filter, from sequence from on, in stream order, until the stream has no
// more or maxBatches requests were made (0: no limit). It returns the
// sequence of the last message read (0 if none) and whether more were
// pending. Messages stored while it reads may or may not be included.
func readStream(ctx context.Context, nc *nats.Conn, prefix, stream, filter string, from uint64, maxBatches int, fn func(storedMsg)) (uint64, bool, error) {
	var last uint64
	for batches := 1; ; batches++ {
		n, end, more, err := directGet(ctx, nc, prefix, stream, filter, max(from, 1), fn)
		if err != nil {
			return last, false, err
		}
		if n > 0 {
			last, from = end, end+1
		}
		if !more || n == 0 {
			return last, false, nil
		}
		if batches == maxBatches {
			return last, true, nil
		}
	}
}

// directGet sends one batched direct get and hands each message to fn. It
// returns how many it read, the last one's sequence, and whether more are
// pending.
func directGet(ctx context.Context, nc *nats.Conn, prefix, stream, filter string, from uint64, fn func(storedMsg)) (n int, last uint64, more bool, err error) {
	body, _ := json.Marshal(struct {
		Seq   uint64 `json:"seq"`
		Next  string `json:"next_by_subj"`
		Batch int    `json:"batch"`
	}{from, filter, directBatch})
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, 0, false, fmt.Errorf("direct get %s: %w", stream, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(prefix+"DIRECT.GET."+stream, inbox, body); err != nil {
		return 0, 0, false, fmt.Errorf("direct get %s: %w", stream, err)
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return n, last, false, fmt.Errorf("direct get %s from %d: %w", stream, from, err)
		}
		switch status := m.Header.Get("Status"); status {
		case "":
		case "204": // end of the batch
			pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			return n, last, pending > 0, nil
		case "404": // nothing at or after from
			return n, last, false, nil
		case "503":
			return n, last, false, fmt.Errorf("direct get %s: %w", stream, nats.ErrNoResponders)
		default:
			return n, last, false, fmt.Errorf("direct get %s: status %s %s", stream, status, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil || seq < from || seq <= last {
			return n, last, false, errors.New("direct get " + stream + ": a reply without a valid sequence")
		}
		at, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
		fn(storedMsg{subject: m.Header.Get(jetstream.SubjectHeader), seq: seq, at: at, data: m.Data})
		n, last = n+1, seq
	}
}
