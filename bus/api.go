package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/presence-dev/presence/presence"
)

// The query service's wire types: the requests and replies of Query, the
// same on NATS (docs/BUS.md) and HTTP (docs/openapi.yaml).

// Query service endpoint names; the subject of each is
// APISubject(region, name).
const (
	EndpointMembers  = "members"
	EndpointCount    = "count"
	EndpointUser     = "user"
	EndpointRooms    = "rooms"
	EndpointCounts   = "counts"
	EndpointLastSeen = "last_seen"
)

// Page limits of the members and rooms endpoints, and the most rooms of
// one counts request.
const (
	DefaultLimit  = 100
	MaxLimit      = 1000
	MaxBatchRooms = 100
)

// DefaultRequestTimeout bounds one query's backend reads.
const DefaultRequestTimeout = 5 * time.Second

// Error codes, in the Nats-Service-Error-Code header on NATS and as the
// HTTP status on HTTP; the body of either is an ErrorReply. The query
// service answers 400 and 500 (and the disconnect endpoint 503); the
// others come from the HTTP API's own checks.
const (
	CodeBadRequest     = "400" // the request is malformed; nothing was read or written
	CodeUnauthorized   = "401" // HTTP: no API key, or an unknown one
	CodeForbidden      = "403" // HTTP: the key's scope does not allow the endpoint
	CodeNotFound       = "404" // HTTP: no such endpoint, or the HTTP API is off
	CodeMethod         = "405" // HTTP: the endpoint does not take that method
	CodeTimeout        = "408" // HTTP: the request body did not arrive in time
	CodeTooLarge       = "413" // HTTP: the request body is over its limit
	CodeTooMany        = "429" // HTTP: the key's rate limit; Retry-After says when to try again
	CodeInternal       = "500" // the backend failed or timed out
	CodeNotImplemented = "501" // HTTP: this server does not do that (an aggregator mints no tokens)
	CodeUnavailable    = "503" // nothing could carry out the request (no node of a region answered)
)

// ErrorReply is the body of an error response; on NATS the same code and
// description are in the micro error headers.
type ErrorReply struct {
	Code  string `json:"code"`
	Error string `json:"error"`
}

// QueryError is an error of a query: Code is one of the codes above.
type QueryError struct {
	Code        string
	Description string
}

// Error implements error.
func (e *QueryError) Error() string {
	return fmt.Sprintf("bus: query: %s %s", e.Code, e.Description)
}

// Reader is what the query service reads presence from; *region.Store
// satisfies it, and so does the cross-region aggregator.
type Reader interface {
	Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error)
	Count(ctx context.Context, room string) (int, error)
	Sessions(ctx context.Context, room, user string) (presence.Member, bool, error)
	LastSeen(ctx context.Context, user string) (time.Time, bool, error)
	// ListRooms returns a page of the rooms with members whose id starts
	// with prefix, after the room after, ordered by id, with the cursor
	// of the next page (empty on the last).
	ListRooms(ctx context.Context, prefix, after string, limit int) ([]presence.RoomCount, string, error)
	// Counts returns the counts of rooms, in their order.
	Counts(ctx context.Context, rooms []string) ([]int, error)
}

// RegionLister is implemented by a Reader that knows which regions hold a
// user: the cross-region aggregator.
type RegionLister interface {
	Regions(room, user string) []string
}

// MembersRequest asks for one page of a room's members. Limit 0 means
// DefaultLimit.
type MembersRequest struct {
	Room   string `json:"room"`
	Offset int    `json:"offset"`
	Limit  int    `json:"limit"`
}

// CountRequest asks for a room's number of members.
type CountRequest struct {
	Room string `json:"room"`
}

// CountReply answers a CountRequest.
type CountReply struct {
	Region string `json:"region"`
	Room   string `json:"room"`
	Count  int    `json:"count"`
}

// UserRequest asks for one user's presence in a room.
type UserRequest struct {
	Room string `json:"room"`
	User string `json:"user"`
}

// UserReply answers a UserRequest. Online is true while the user is a
// member of the room, including inside the offline grace (Member then has
// no sessions). LastSeen is the user's last activity in the view, in any
// room.
type UserReply struct {
	Region   string           `json:"region"`
	Room     string           `json:"room"`
	User     string           `json:"user"`
	Online   bool             `json:"online"`
	Member   *presence.Member `json:"member"`
	LastSeen *time.Time       `json:"last_seen"`
	// Regions lists the regions where the user is present; only the
	// global view (a Reader that is a RegionLister) fills it.
	Regions []string `json:"regions,omitempty"`
}

// LastSeenRequest asks when a user was last active, in any room.
type LastSeenRequest struct {
	User string `json:"user"`
}

// LastSeenReply answers a LastSeenRequest; LastSeen is nil when no
// activity was recorded.
type LastSeenReply struct {
	Region   string     `json:"region"`
	User     string     `json:"user"`
	LastSeen *time.Time `json:"last_seen"`
}

// RoomsRequest asks for one page of the view's rooms. Limit 0 means
// DefaultLimit.
type RoomsRequest struct {
	Prefix string `json:"prefix"`
	Cursor string `json:"cursor"`
	Limit  int    `json:"limit"`
}

// RoomsReply answers a RoomsRequest: NextCursor is the Cursor of the
// next page, empty on the last one.
type RoomsReply struct {
	Region     string               `json:"region"`
	Rooms      []presence.RoomCount `json:"rooms"`
	NextCursor string               `json:"next_cursor"`
}

// CountsRequest asks for the counts of up to MaxBatchRooms rooms.
type CountsRequest struct {
	Rooms []string `json:"rooms"`
}

// CountsReply answers a CountsRequest, the rooms in the order asked.
type CountsReply struct {
	Region string               `json:"region"`
	Rooms  []presence.RoomCount `json:"rooms"`
}
