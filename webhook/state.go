package webhook

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StateBucket is the KV bucket the dispatchers share: their leases and
// membership, each lane's room positions, owed markers and stream record.
// Keys (ids base64url-encoded, since KV keys take fewer bytes than ids):
//
//	lease.<endpoint>.<source>          the dispatcher delivering the lane
//	member.<instance>                  a running dispatcher (fair share)
//	lane.<endpoint>.<source>           the stream the lane last read (its creation time)
//	pos.<endpoint>.<source>.<room>     the room's position: every event up to it is settled
//	owe.<endpoint>.<source>.<room>     a dead_letter marker the room's endpoint has not been sent
const StateBucket = "PRESENCE_webhooks"

// DefaultStateMaxAge is how long a room's position is kept after its last
// write: longer than the streams keep events (24 h by default), so a room
// is never met again without its position while the stream holds any of
// its events.
const DefaultStateMaxAge = 25 * time.Hour

// tok makes an id one KV key token.
func tok(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func laneKey(prefix string, l LaneID) string { return prefix + "." + l.Endpoint + "." + tok(l.Source) }

func roomKey(prefix string, l LaneID, room string) string {
	return laneKey(prefix, l) + "." + tok(room)
}

// stateConfig sets the bucket up.
type stateConfig struct {
	MaxAge   time.Duration
	Replicas int
	LeaseTTL time.Duration
	Storage  jetstream.StorageType
}

// state is the dispatchers' shared KV bucket. If the bucket is gone (its
// JetStream store lost), the next operation makes it again.
type state struct {
	js  jetstream.JetStream
	cfg stateConfig

	mu sync.Mutex
	kv jetstream.KeyValue
}

func newState(js jetstream.JetStream, cfg stateConfig) *state { return &state{js: js, cfg: cfg} }

func (s *state) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kv != nil {
		return s.kv, nil
	}
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: StateBucket, Description: "presence webhooks: leases, room positions", History: 1,
		TTL: s.cfg.MaxAge, Replicas: s.cfg.Replicas, Storage: s.cfg.Storage,
		LimitMarkerTTL: max(s.cfg.LeaseTTL, time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("webhook: state bucket: %w", err)
	}
	s.kv = kv
	return kv, nil
}

// do runs f on the bucket, making the bucket again once if it is gone.
// A timeout can hide a missing bucket (a lookup that waits for a stream
// that is not there), so one is checked with a lookup of its own.
func (s *state) do(ctx context.Context, f func(jetstream.KeyValue) error) error {
	for try := 0; ; try++ {
		kv, err := s.bucket(ctx)
		if err != nil {
			return err
		}
		err = f(kv)
		if err == nil || try > 0 || !(bucketGone(err) || errors.Is(err, context.DeadlineExceeded) && s.missing()) {
			return err
		}
		s.mu.Lock()
		s.kv = nil
		s.mu.Unlock()
		if ctx.Err() != nil {
			return err
		}
	}
}

// missing reports whether the bucket's stream is known to be gone.
func (s *state) missing() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := s.js.Stream(ctx, "KV_"+StateBucket)
	return errors.Is(err, jetstream.ErrStreamNotFound)
}

// bucketGone reports whether err says the bucket's stream is not there.
func bucketGone(err error) bool {
	return errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// position reads room's persisted position; nil if none.
func (s *state) position(ctx context.Context, l LaneID, room string) (*position, error) {
	var p *position
	err := s.do(ctx, func(kv jetstream.KeyValue) error {
		e, err := kv.Get(ctx, roomKey("pos", l, room))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		p = new(position)
		return json.Unmarshal(e.Value(), p)
	})
	return p, err
}

// persist writes a settlement's positions and owed markers, pipelined,
// and returns once every write is stored.
func (s *state) persist(ctx context.Context, l LaneID, st settlement) error {
	return s.do(ctx, func(kv jetstream.KeyValue) error {
		var futs []jetstream.PubAckFuture
		put := func(key string, p position) error {
			b, _ := json.Marshal(p)
			f, err := s.js.PublishAsync("$KV."+StateBucket+"."+key, b)
			futs = append(futs, f)
			return err
		}
		for room, p := range st.positions {
			if err := put(roomKey("pos", l, room), p); err != nil {
				return err
			}
		}
		for room, p := range st.owe {
			if err := put(roomKey("owe", l, room), p); err != nil {
				return err
			}
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		for _, room := range st.paid {
			if err := kv.Delete(ctx, roomKey("owe", l, room)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
				return err
			}
		}
		return nil
	})
}

// owed lists the lane's owed markers.
func (s *state) owed(ctx context.Context, l LaneID) (map[string]position, error) {
	out := map[string]position{}
	prefix := laneKey("owe", l) + "."
	err := s.do(ctx, func(kv jetstream.KeyValue) error {
		keys, err := kv.ListKeysFiltered(ctx, prefix+"*")
		if err != nil {
			return err
		}
		for k := range keys.Keys() {
			room, err := base64.RawURLEncoding.DecodeString(k[len(prefix):])
			if err != nil {
				continue
			}
			e, err := kv.Get(ctx, k)
			if err != nil {
				continue // deleted meanwhile
			}
			var p position
			if json.Unmarshal(e.Value(), &p) == nil {
				out[string(room)] = p
			}
		}
		return nil
	})
	return out, err
}

// laneRecord is the stream a lane last read, by its creation time.
type laneRecord struct {
	StreamCreated time.Time `json:"stream_created"`
}

func (s *state) lane(ctx context.Context, l LaneID) (*laneRecord, error) {
	var r *laneRecord
	err := s.do(ctx, func(kv jetstream.KeyValue) error {
		e, err := kv.Get(ctx, laneKey("lane", l))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		r = new(laneRecord)
		return json.Unmarshal(e.Value(), r)
	})
	return r, err
}

func (s *state) setLane(ctx context.Context, l LaneID, r laneRecord) error {
	b, _ := json.Marshal(r)
	return s.do(ctx, func(kv jetstream.KeyValue) error {
		_, err := kv.Put(ctx, laneKey("lane", l), b)
		return err
	})
}
