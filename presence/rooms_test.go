package presence

import (
	"slices"
	"testing"
)

func TestPageOfRooms(t *testing.T) {
	sorted := []string{"a1", "a2", "a3", "b1", "b2", "c"}
	for _, c := range []struct {
		prefix, after string
		limit         int
		want          []string
		more          bool
	}{
		{"", "", 10, sorted, false},
		{"", "", 6, sorted, false},
		{"", "", 5, sorted[:5], true},
		{"a", "", 2, []string{"a1", "a2"}, true},
		{"a", "a2", 2, []string{"a3"}, false},
		{"b", "a2", 5, []string{"b1", "b2"}, false},
		{"b", "b1", 5, []string{"b2"}, false},
		{"b", "c", 5, nil, false},
		{"", "b2", 5, []string{"c"}, false},
		{"", "zz", 5, nil, false},
		{"x", "", 5, nil, false},
		{"a1", "", 5, []string{"a1"}, false},
		{"a1", "a1", 5, nil, false},
	} {
		page, more := PageOfRooms(sorted, c.prefix, c.after, c.limit)
		if !slices.Equal(page, c.want) || more != c.more {
			t.Errorf("prefix %q after %q limit %d: %v %v, want %v %v", c.prefix, c.after, c.limit, page, more, c.want, c.more)
		}
	}
}
