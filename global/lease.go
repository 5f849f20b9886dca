package global

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// newInstance returns a random id naming one process.
func newInstance() string {
	var b [9]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// ensureLeaseBucket returns the lease bucket, creating it (or updating
// its marker TTL) only when needed: a lookup is answered by the bucket's
// own servers, while a create or update needs the JetStream meta leader,
// which a partition of a two-cluster supercluster leaves on neither side.
func ensureLeaseBucket(ctx context.Context, js jetstream.JetStream, bucket string, ttl time.Duration, placement *jetstream.Placement, replicas int, storage jetstream.StorageType) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "presence: leader lease",
		History:     1,
		Storage:     storage,
		Replicas:    replicas,
		Placement:   placement,
		// Expired keys leave a marker for this long, so a new holder can
		// Create the key again.
		LimitMarkerTTL: max(ttl, MinLeaseTTL),
	}
	st, err := js.Stream(ctx, "KV_"+bucket)
	switch {
	case err == nil && st.CachedInfo().Config.SubjectDeleteMarkerTTL == cfg.LimitMarkerTTL:
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return nil, fmt.Errorf("global: lease bucket %s: %w", bucket, err)
		}
		return kv, nil
	case err == nil:
		kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("global: lease bucket %s: %w", bucket, err)
		}
		return kv, nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("global: lease bucket %s: %w", bucket, err)
	}
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, bucket) // created meanwhile by another
	}
	if err != nil {
		return nil, fmt.Errorf("global: lease bucket %s: %w", bucket, err)
	}
	return kv, nil
}

// lease is leader election on one KV key: the holder creates it with a
// TTL and refreshes it, compare-and-set on its revision, every ttl/4.
// Whoever fails to refresh (or sees another holder) is not the leader;
// a holder that cannot reach the bucket stops leading a quarter TTL before
// the key can expire, so two holders never overlap on a common clock.
// Not safe for concurrent use.
type lease struct {
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	subject string // the key's subject in the bucket's stream
	key, id string
	ttl     time.Duration

	held  bool
	rev   uint64    // revision of our latest write while held
	gen   uint64    // revision that made us holder: grows with every new holder
	until time.Time // act as holder until then without a successful refresh
}

func newLease(js jetstream.JetStream, kv jetstream.KeyValue, bucket, key, id string, ttl time.Duration) *lease {
	return &lease{js: js, kv: kv, subject: "$KV." + bucket + "." + key, key: key, id: id, ttl: ttl}
}

// interval is how often tick should run.
func (l *lease) interval() time.Duration { return l.ttl / 4 }

// tick acquires or refreshes the lease and reports whether it is held and
// the generation it was acquired at.
func (l *lease) tick(ctx context.Context) (bool, uint64) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, l.interval())
	defer cancel()
	if l.held {
		ack, err := l.js.PublishMsg(ctx, &nats.Msg{Subject: l.subject, Data: []byte(l.id)},
			jetstream.WithExpectLastSequencePerSubject(l.rev), jetstream.WithMsgTTL(l.ttl))
		switch {
		case err == nil:
			l.rev, l.until = ack.Sequence, start.Add(l.ttl-l.ttl/4)
		case isAPIError(err):
			l.held = false // someone else holds it, or it expired
		case time.Now().After(l.until):
			l.held = false // cannot tell: stop before it can expire
		}
		if l.held {
			return true, l.gen
		}
	}
	rev, err := l.kv.Create(ctx, l.key, []byte(l.id), jetstream.KeyTTL(l.ttl))
	if errors.Is(err, jetstream.ErrKeyExists) {
		// A refresh of ours may have landed without its ack.
		if e, gerr := l.kv.Get(ctx, l.key); gerr == nil && string(e.Value()) == l.id && l.gen != 0 {
			l.held, l.rev, l.until = true, e.Revision(), start.Add(l.ttl-l.ttl/4)
			return true, l.gen
		}
		return false, 0
	}
	if err != nil {
		return false, 0
	}
	l.held, l.rev, l.gen, l.until = true, rev, rev, start.Add(l.ttl-l.ttl/4)
	return true, l.gen
}

// release gives the lease up so another candidate takes over at its next
// tick rather than after the TTL.
func (l *lease) release(ctx context.Context) {
	if !l.held {
		return
	}
	l.held = false
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = l.kv.Delete(ctx, l.key, jetstream.LastRevision(l.rev))
}

// isAPIError reports whether the server answered err (as opposed to a
// timeout or a lost connection).
func isAPIError(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr)
}
