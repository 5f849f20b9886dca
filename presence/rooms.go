package presence

// RoomCount is a room and its number of members: an entry of a region's
// room list.
type RoomCount struct {
	Room  string `json:"room"`
	Count int    `json:"count"`
}
