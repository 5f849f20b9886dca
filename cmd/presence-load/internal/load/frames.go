package load

import (
	"encoding/json"

	"github.com/presence-dev/presence/protocol"
)

// Encode is a request frame as the project's protocol package defines it
// (docs/PROTOCOL.md): the tool writes no JSON of its own to a node.
func Encode(r protocol.Request) []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // a Request has only strings, numbers and raw JSON
	}
	return b
}

// Ptr is a pointer to v, for a Request's optional fields.
func Ptr[T any](v T) *T { return &v }
