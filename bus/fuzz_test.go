package bus

import (
	"reflect"
	"testing"
)

// Whatever arrives on a presence subject, DecodeEvent returns an error or
// a transition that encodes and decodes back to itself; it never panics.
func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"v":1,"id":"eu/r/1/1","kind":"online","reason":"joined","region":"eu","room":"r","user":"u","sessions":1,"seq":1,"epoch":1,"at":"2026-11-29T19:48:47.002Z"}`))
	f.Add([]byte(`{"v":1,"id":"x","kind":"update","region":"global","room":"r","user":"u","session":"s","state":{"a":[1,2]}}`))
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := DecodeEvent(data)
		if err != nil {
			return
		}
		b, err := EncodeEvent(tr)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", tr, err)
		}
		back, err := DecodeEvent(b)
		if err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", b, err)
		}
		// The time comes back in UTC, and the state compacted (and HTML
		// escaped): the same values, other bytes.
		back.At, tr.At = back.At.UTC(), tr.At.UTC()
		back.State, tr.State = nil, nil
		if !reflect.DeepEqual(back, tr) {
			t.Fatalf("round trip changed the event:\n%+v\n%+v", tr, back)
		}
	})
}
