// Package protocol is the client protocol of docs/PROTOCOL.md, version 1,
// as Go: the frame types, error codes and close codes a node and its
// clients exchange over WebSocket. It owns them; package node (the
// server), package client (the Go client) and the load tool use them.
//
// A test holds PROTOCOL.md's tables of error codes, close codes and
// request types to the constants here, so the page and the code cannot
// drift apart.
package protocol

// Version is the protocol version a node announces in hello.
const Version = 1

// The handshake: GET PathWebSocket?session=<id> with a token.
const (
	PathWebSocket = "/v1/ws"
	// Subprotocol is the protocol a node speaks. A client offering
	// subprotocols must offer it, and the node selects it.
	Subprotocol = "presence.v1"
	// TokenSubprotocolPrefix prefixes a token passed as a subprotocol
	// entry: new WebSocket(url, ["presence.v1", "bearer." + jwt]).
	TokenSubprotocolPrefix = "bearer."
	// TokenQueryParam carries a token in the URL.
	TokenQueryParam = "access_token"
	// SessionQueryParam carries the client-chosen session id (required).
	SessionQueryParam = "session"
	// UserQueryParam carries the user id in a dev node's handshake
	// without a token.
	UserQueryParam = "user"
)

// Close codes a node sends. Codes 1000-1015 are RFC 6455's; 4000-4999 are
// the application's own.
const (
	CloseGoingAway    = 1001 // Close without Drain: the node is stopping
	ClosePolicy       = 1008 // persistent rate-limit abuse: back off before reconnecting
	CloseTooBig       = 1009 // a frame was over the frame size limit
	CloseRestart      = 1012 // Drain: reconnect (elsewhere) with the same session id
	CloseSlowConsumer = 4000 // the client read too slowly; reconnect
	CloseSessionMoved = 4001 // the session was accepted on a newer connection (another node); the session lives on
	CloseTokenExpired = 4002 // the token expired without a refresh; reconnect with a fresh one
	CloseDisconnected = 4003 // the server API disconnected the user; reconnect with a fresh token, after a backoff
	CloseRevoked      = 4004 // the server API revoked the user until the time the reason names; do not reconnect before it
	CloseUnauthorized = 4401 // a browser's handshake failed authentication; the reason says why (instead of a 401 it cannot read)
)

// RevokedUntilPrefix begins the reason of a CloseRevoked close, followed
// by an RFC 3339 UTC time.
const RevokedUntilPrefix = "revoked until "

// ErrorCode is the stable code of an error frame.
type ErrorCode string

// Error codes. A client acts on the code, never on the message.
const (
	CodeBadFrame      ErrorCode = "bad_frame"      // not a JSON object of the documented shape, or a binary frame
	CodeUnknownType   ErrorCode = "unknown_type"   // type is not one this version knows
	CodeInvalidRoom   ErrorCode = "invalid_room"   // room missing or not a valid id
	CodeInvalidState  ErrorCode = "invalid_state"  // state missing, not JSON, or over presence.MaxStateBytes
	CodeForbidden     ErrorCode = "forbidden"      // the token does not grant the room
	CodeInvalidToken  ErrorCode = "invalid_token"  // refresh with a token that is bad, expired or for another user
	CodeInvalidPage   ErrorCode = "invalid_page"   // members with an offset or limit out of range
	CodeInvalidDetail ErrorCode = "invalid_detail" // join with a detail other than "sessions"
	CodeTooManyRooms  ErrorCode = "too_many_rooms" // the rooms-per-connection limit reached
	CodeNotJoined     ErrorCode = "not_joined"     // leave or state for a room not joined (state: or joined without presence)
	CodeInvalidView   ErrorCode = "invalid_view"   // join with a view other than "members" or "count", detail with count, or a presence change
	CodeInvalidWatch  ErrorCode = "invalid_watch"  // watch without users, too many, an invalid or repeated id, or on the global view
	CodeRateLimited   ErrorCode = "rate_limited"   // frame dropped by the rate limit; slow down
	CodeUnavailable   ErrorCode = "unavailable"    // the store or NATS failed; nothing changed, retry later
	CodeRevoked       ErrorCode = "revoked"        // join of a room the server API revoked the user from, until the time the message names
)

// Client-to-node frame types (requests).
const (
	TypeJoin    = "join"
	TypeLeave   = "leave"
	TypeState   = "state"
	TypePing    = "ping"
	TypeRefresh = "refresh"
	TypeMembers = "members" // also the reply's type
	TypeWatch   = "watch"
)

// Node-to-client frame types.
const (
	TypeHello     = "hello"
	TypeSnapshot  = "snapshot"
	TypeEvent     = "event"
	TypeEvents    = "events"
	TypeCount     = "count"
	TypeWatching  = "watching"
	TypeLeft      = "left"
	TypeStateSet  = "state_set"
	TypePong      = "pong"
	TypeRefreshed = "refreshed"
	TypeError     = "error"
)

// Reasons of snapshot, count, watching and left frames.
const (
	ReasonJoin    = "join"    // a snapshot or count answering a join
	ReasonResync  = "resync"  // the node lost events and starts the room (or watch) over
	ReasonWatch   = "watch"   // a watching answering a watch
	ReasonRevoked = "revoked" // an unasked left or watching: a refreshed token no longer grants the room
)

// The join's detail and view values.
const (
	DetailSessions = "sessions" // every member's session list, not only their states
	ViewMembers    = "members"  // the default view
	ViewCount      = "count"    // the member count only
)

// MaxRefLen bounds a request's ref, which is echoed.
const MaxRefLen = 64
