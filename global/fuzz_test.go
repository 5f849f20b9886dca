package global

import (
	"testing"

	"github.com/presence-dev/presence/bus"
)

// Whatever arrives on a sync subject, decodePublication returns an error
// or a publication that applies to a region's view without panicking,
// and whose operations, chunked and sent again, decode again.
func FuzzDecodePublication(f *testing.F) {
	f.Add(bus.SyncDeltaSubject("eu"), []byte(`{"v":1,"kind":"delta","region":"eu","gen":1,"inst":"i","seq":1,"at":0,"rooms":[{"room":"r","set":{"u":["s"]},"st":{"u":{"s":{"a":1}}},"del":["x"]}]}`))
	f.Add(bus.SyncFullSubject("eu"), []byte(`{"v":1,"kind":"full","region":"eu","gen":1,"inst":"i","seq":1,"part":1,"parts":1,"rooms":[{"room":"r","set":{"u":[]}}]}`))
	f.Add(bus.SyncDeltaSubject("eu"), []byte(`{"v":1}`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		p, err := decodePublication(subject, data)
		if err != nil {
			return
		}
		v, st := regionView{}, stateView{}
		v.Apply(p.Rooms)
		st.Apply(p.Rooms)
		for i, chunk := range chunkOps(p.Rooms, 1<<10) {
			q := *p
			q.Rooms = chunk
			b := mustJSON(t, q)
			if _, err := decodePublication(subject, b); err != nil {
				t.Fatalf("chunk %d of an accepted publication is refused: %v\n%s", i, err, b)
			}
		}
	})
}
