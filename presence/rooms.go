package presence

import (
	"sort"
	"strings"
)

// RoomCount is a room and its number of members: an entry of a region's
// room list.
type RoomCount struct {
	Room  string `json:"room"`
	Count int    `json:"count"`
}

// PageOfRooms takes from sorted (room ids in ascending order) the first
// limit that start with prefix and sort after after: a page of a room
// list whose cursor is the last room of the page before. more says
// whether any further room of the prefix follows.
func PageOfRooms(sorted []string, prefix, after string, limit int) (page []string, more bool) {
	i := sort.SearchStrings(sorted, max(prefix, after))
	if i < len(sorted) && sorted[i] == after {
		i++
	}
	for ; i < len(sorted) && strings.HasPrefix(sorted[i], prefix); i++ {
		if len(page) == limit {
			return page, true
		}
		page = append(page, sorted[i])
	}
	return page, false
}
