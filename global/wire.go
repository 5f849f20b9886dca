package global

import (
	"fmt"
	"strings"
)

// Names on the wire that package global owns. The subjects themselves are
// built in package bus (bus/subject.go holds the whole namespace).

// keyEscape maps a region id onto the bytes KV bucket names allow
// ([A-Za-z0-9_-]): other bytes, and '_' itself, become _XX (hex).
func keyEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "_%02X", c)
		}
	}
	return b.String()
}
