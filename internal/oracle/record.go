package oracle

import "time"

// Every time in a Run is a duration since the run's start, from the
// harness's clock; event times (Event.At) are the store's clock, on the
// same host.

// Run is everything the harness recorded: what it did, when it really
// happened, and what the service said. It is the oracle's whole input.
type Run struct {
	Seed   int64
	Timing Timing // what the oracle assumes
	// End is when observation stopped: every departure whose window closes
	// before it is judged.
	End   time.Duration
	Nodes []Node
	Conns []Conn
	// Stream is every message of the region's JetStream stream, in stream
	// order.
	Stream []Event
	// Core is every delivery to the plain subscriber on presence.>, in
	// arrival order (Event.Arrived is that delivery's time).
	Core []Event
	// CoreDropped is what the subscriber's client dropped as a slow
	// consumer: a harness fault, not the service's; it voids check 7.
	CoreDropped int
	// Ops counts the operations the harness carried out, by kind.
	Ops     map[string]int
	Final   Final
	Resyncs []Resync
	// Notes are things the harness saw that are not transitions: closes
	// with unexpected codes, error replies, acks that never came.
	Notes []Note
	// Empty are the members with no session that clients' snapshots
	// listed (PROTOCOL.md rules them out).
	Empty []Empty
	// Lag is, for each operation, how late the harness started it against
	// the plan: a harness that cannot keep up drifts, and its run says
	// less (the oracle still judges by recorded times).
	Lag []time.Duration
}

// Node is one node process, from start to death.
type Node struct {
	ID      int // index in Run.Nodes
	Slot    int // which of the scenario's nodes it is; a restart is a new Node in the same slot
	Started time.Duration
	// Died is when the harness sent SIGKILL (Killed) or saw the process
	// exit on its own (a crash); None while it lives.
	Died   time.Duration
	Killed bool
	Exit   string // how it exited, for a crash
}

// ConnEnd is how a connection ended, as the client saw it.
type ConnEnd uint8

// Connection ends.
const (
	Open         ConnEnd = iota // still open at the end of the run
	Closed                      // the client sent a close frame
	Reset                       // the client reset the TCP connection
	ServerClosed                // the node sent a close frame (EndCode)
	Dropped                     // the connection failed without a close frame
)

func (e ConnEnd) String() string {
	return [...]string{"open", "closed", "reset", "server-closed", "dropped"}[e]
}

// Close codes that keep the sessions: the node stopped holding them without
// releasing them.
const (
	CodeGoingAway    = 1001
	CodeRestart      = 1012
	CodeSessionMoved = 4001
)

// Conn is one WebSocket connection of a tab (user, session).
type Conn struct {
	ID      int // index in Run.Conns
	User    string
	Session string
	Node    int // Node.ID it was opened on
	Dialed  time.Duration
	Opened  time.Duration // hello received
	End     time.Duration // None while open
	How     ConnEnd
	Code    int // close code for ServerClosed
	Holds   []Hold
	States  []StateSet
}

// Hold is one join of a room on a connection, until its leave or the
// connection's end.
type Hold struct {
	Room     string
	JoinSent time.Duration
	// JoinAcked is when the join's snapshot reply arrived; None if it never
	// did (the join may or may not have reached the store).
	JoinAcked time.Duration
	LeaveSent time.Duration // None: held until the connection ended
}

// StateSet is one state frame; State is the JSON sent, "" for null.
type StateSet struct {
	Room  string
	Sent  time.Duration
	Acked time.Duration // None: no state_set reply
	State string
}

// Event is one transition as the bus carried it.
type Event struct {
	ID       string
	Kind     string // online, offline, update
	Reason   string
	Room     string
	User     string
	Sessions int
	Seq      uint64
	Epoch    int64
	At       time.Duration // the event's at (store clock)
	Arrived  time.Duration // delivery to the core subscriber; None if never
	// Stored is when the stream stored it (the message's timestamp); None
	// for a core delivery. An announcement is judged late by the earlier
	// of Stored and Arrived, so a harness slow to read its subscription
	// cannot make the service look late.
	Stored  time.Duration
	Session string // update only
	State   string // update only; "" when cleared
}

// Members is a room's membership: user -> session -> state ("" for none).
type Members map[string]map[string]string

// Final is what the harness read after quiescing.
type Final struct {
	At    time.Duration
	Query map[string]Members // room -> the query service's members
	Fresh map[string]Members // room -> a fresh WebSocket snapshot's members
	// Observer is the user of the client that took the fresh snapshots;
	// client views may or may not include it yet.
	Observer string
	Views    []View
	// Errors are final reads that failed (no node answered in time).
	Errors []string
}

// View is what one open connection believes a room holds: its join
// snapshot, then the room's events in arrival order, replaced by each
// resync snapshot.
type View struct {
	Conn    int
	Room    string
	Members Members
}

// Resync is one unasked snapshot (reason resync) a client received.
type Resync struct {
	Conn int
	Room string
	At   time.Duration
	// Base is the highest seq the client had applied (its snapshot's
	// room_seq or its last event) in Epoch; Contiguous is whether it had
	// every seq from its snapshot up to Base.
	Base       uint64
	Epoch      int64
	Contiguous bool
	SnapSeq    uint64
	SnapEpoch  int64
}

// Empty is a member with no session listed by a client's join or resync
// snapshot.
type Empty struct {
	Conn       int
	Room, User string
	At         time.Duration
}

// Note is an observation that is not a transition.
type Note struct {
	At   time.Duration
	Conn int // -1 when not about a connection
	What string
}
