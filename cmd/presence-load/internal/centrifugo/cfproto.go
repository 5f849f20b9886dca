package centrifugo

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/presence-dev/presence/cmd/presence-load/internal/churn"
)

// The pure parts of the centrifugo mode: Centrifugo's JSON protocol (v2,
// the only one of Centrifugo v6: github.com/centrifugal/protocol,
// client.proto) as the load tool reads it, and the accounting of the
// churners' join and leave pushes at a sampled subscriber.
//
// A WebSocket frame from Centrifugo holds one or more messages, one JSON
// object a line ("\n" between them): the writer sends what a connection
// has queued as one frame. A message is a reply ({"id":N,...}, or
// {"id":N,"error":{...}}), a push ({"push":{"channel":...,"join":{...}}})
// or the server's ping, an empty object {} that the client answers with
// {} (the connect reply says "pong":true).

// Kinds of a Centrifugo message.
const (
	cfPing     = "ping"
	cfReply    = "reply"
	cfErrReply = "error"
	cfJoin     = "join"
	cfLeave    = "leave"
	cfPub      = "pub"
	cfPushElse = "push" // any other push (unsubscribe, disconnect, message, ...)
	cfBad      = "bad"
)

// cfLines calls f with each message of a frame (newline-delimited, empty
// lines skipped) and returns how many there were.
func cfLines(frame []byte, f func(line []byte)) int {
	n := 0
	for len(frame) > 0 {
		i := bytes.IndexByte(frame, '\n')
		line := frame
		if i >= 0 {
			line, frame = frame[:i], frame[i+1:]
		} else {
			frame = nil
		}
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			continue
		}
		n++
		if f != nil {
			f(line)
		}
	}
	return n
}

// cfClassify tells a message's kind from its first keys, without parsing
// it: Centrifugo's encoder writes "id" first in a reply, "channel" first
// in a push, then the push's one field.
func cfClassify(line []byte) string {
	switch {
	case string(line) == "{}":
		return cfPing
	case bytes.HasPrefix(line, []byte(`{"id":`)):
		// The id's digits, then "," and the result's key.
		rest := line[len(`{"id":`):]
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 {
			return cfBad
		}
		if bytes.HasPrefix(rest[i:], []byte(`,"error":`)) {
			return cfErrReply
		}
		return cfReply
	case bytes.HasPrefix(line, []byte(`{"push":{`)):
		rest := line[len(`{"push":{`):]
		if bytes.HasPrefix(rest, []byte(`"channel":"`)) {
			rest = rest[len(`"channel":"`):]
			end := jsonStringEnd(rest)
			if end < 0 || end+1 >= len(rest) || rest[end+1] != ',' {
				return cfBad
			}
			rest = rest[end+2:]
		}
		key, ok := leadingKey(rest)
		if !ok {
			return cfBad
		}
		switch key {
		case "join":
			return cfJoin
		case "leave":
			return cfLeave
		case "pub":
			return cfPub
		}
		return cfPushElse
	}
	return cfBad
}

// jsonStringEnd is the index of the quote that ends a JSON string whose
// body starts at s[0], or -1.
func jsonStringEnd(s []byte) int {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// leadingKey reads `"key":` at the start of s.
func leadingKey(s []byte) (string, bool) {
	if len(s) < 3 || s[0] != '"' {
		return "", false
	}
	end := jsonStringEnd(s[1:])
	if end < 0 || end+2 >= len(s) || s[end+2] != ':' {
		return "", false
	}
	return string(s[1 : end+1]), true
}

// cfInfo is a push's ClientInfo.
type cfInfo struct {
	User   string `json:"user"`
	Client string `json:"client"`
}

// cfMsg is the union of the messages the tool reads in full.
type cfMsg struct {
	ID    uint32 `json:"id"`
	Error *struct {
		Code    uint32 `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Push *struct {
		Channel string                 `json:"channel"`
		Join    *struct{ Info cfInfo } `json:"join"`
		Leave   *struct{ Info cfInfo } `json:"leave"`
	} `json:"push"`
	Connect *struct {
		Client  string `json:"client"`
		Version string `json:"version"`
		Ping    uint32 `json:"ping"`
		Pong    bool   `json:"pong"`
	} `json:"connect"`
	Presence *struct {
		Presence map[string]cfInfo `json:"presence"`
	} `json:"presence"`
	PresenceStats *struct {
		NumClients uint32 `json:"num_clients"`
		NumUsers   uint32 `json:"num_users"`
	} `json:"presence_stats"`
}

// cfJoinLeave reads a join or leave push: its kind, channel and user.
func cfJoinLeave(line []byte) (kind, channel, user string, err error) {
	var m cfMsg
	if err := json.Unmarshal(line, &m); err != nil {
		return "", "", "", err
	}
	switch {
	case m.Push == nil:
		return "", "", "", errors.New("not a push")
	case m.Push.Join != nil:
		return cfJoin, m.Push.Channel, m.Push.Join.Info.User, nil
	case m.Push.Leave != nil:
		return cfLeave, m.Push.Channel, m.Push.Leave.Info.User, nil
	}
	return "", "", "", errors.New("neither join nor leave")
}

// cfError is an error reply's text, "" when m is not one.
func (m *cfMsg) errText() string {
	if m.Error == nil {
		return ""
	}
	return strconv.Itoa(int(m.Error.Code)) + " " + m.Error.Message
}

// cfTrack times the join and leave pushes of one churn step's churners
// (users Prefix+i, i < N) at one subscriber, in µs since the run's base.
type cfTrack struct {
	prefix          string
	on, off         []int64
	dupOn, dupOff   int
	foreign         int // join/leave of a churner index out of range
	wrongChannel    int
	joins, leaves   int64 // all join and leave pushes seen (churners or not)
	channel         string
	examples        []string
	lastJoinAtUS    int64
	lastAnyUS       int64
	churnJoinsSeen  int
	churnLeavesSeen int
}

func newCfTrack(channel, prefix string, n int) *cfTrack {
	return &cfTrack{channel: channel, prefix: prefix, on: make([]int64, n), off: make([]int64, n)}
}

// see records one join or leave push read at atUS.
func (t *cfTrack) see(kind, channel, user string, atUS int64) {
	t.lastAnyUS = atUS
	if channel != t.channel {
		t.wrongChannel++
		return
	}
	if kind == cfJoin {
		t.joins++
		t.lastJoinAtUS = atUS
	} else {
		t.leaves++
	}
	rest, ok := strings.CutPrefix(user, t.prefix)
	if !ok || t.prefix == "" {
		return
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= len(t.on) {
		t.foreign++
		return
	}
	slot, dup := &t.on[i], &t.dupOn
	if kind == cfLeave {
		slot, dup = &t.off[i], &t.dupOff
	}
	if *slot != 0 {
		*dup++
		if len(t.examples) < 3 {
			t.examples = append(t.examples, kind+" of "+user+" twice")
		}
		return
	}
	*slot = atUS
	if kind == cfJoin {
		t.churnJoinsSeen++
	} else {
		t.churnLeavesSeen++
	}
}

// report adds the latencies of the churners req expects (SendUS > 0:
// its subscribe was answered; LeaveUS > 0: its unsubscribe was sent) to
// out: seen ones as latencies, the others as never seen, or as at a lost
// connection when the subscriber's connection ended.
func (t *cfTrack) report(req *churn.Sent, lost bool, out *cfReport) {
	out.Conns++
	for i := range t.on {
		if i >= len(req.SendUS) || req.SendUS[i] == 0 {
			continue
		}
		out.Expects++
		switch {
		case t.on[i] > 0:
			out.On = append(out.On, t.on[i]-req.SendUS[i])
		case lost:
			out.LostConn++
		default:
			out.OnNever++
		}
		if i < len(req.LeaveUS) && req.LeaveUS[i] > 0 {
			switch {
			case t.off[i] > 0:
				out.Off = append(out.Off, t.off[i]-req.LeaveUS[i])
			case lost:
			default:
				out.OffNever++
			}
		}
	}
	out.Dups += t.dupOn + t.dupOff
	out.Foreign += t.foreign + t.wrongChannel
}

// cfReport is churn.Arrivals with what only Centrifugo's pushes can show.
type cfReport struct {
	churn.Arrivals
	Dups    int `json:"dups"`    // a churner's join or leave pushed twice
	Foreign int `json:"foreign"` // pushes of another channel, or of churner indices out of range
}

func (a *cfReport) add(b cfReport) {
	a.Arrivals.Add(b.Arrivals)
	a.Dups += b.Dups
	a.Foreign += b.Foreign
}

// cfFillPushes is how many join pushes filling a channel of n
// subscribers one after another delivers: the k-th subscriber sees the
// joins of the n-k after it (each joiner gets no push of its own join).
func cfFillPushes(n int) int64 {
	if n < 2 {
		return 0
	}
	return int64(n) * int64(n-1) / 2
}
