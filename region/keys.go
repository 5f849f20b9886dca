package region

import (
	"hash/crc32"
	"strconv"
)

// This file is the one place that names Redis keys (the schema is
// documented in doc.go) and puts them in the KEYS order of each script.

// roomKeys are the keys of one room, named as in the package doc's table
// and in room_at in lib.lua.
type roomKeys struct{ z, s, m, o, st, g, u, mv string }

func (s *Store) roomKeys(room string) roomKeys {
	b := s.opt.Prefix + ":{" + room + "}"
	return roomKeys{z: b, s: b + ":s", m: b + ":m", o: b + ":o", st: b + ":st", g: b + ":g", u: b + ":u", mv: b + ":mv"}
}

// all is the room's keys in the order room_at in lib.lua reads them.
func (k roomKeys) all() []string { return []string{k.z, k.s, k.m, k.o, k.st, k.g, k.u, k.mv} }

// writeKeys are the KEYS of release, state, ack and reap: the reap index
// of the room's slot, then the room, then the slot's change log, its set
// of rooms with a grace and its holders' last writes.
func (k roomKeys) writeKeys(index string) []string {
	return append(append([]string{index}, k.all()...), changesKey(index), gracesKey(index), writesKey(index))
}

// snapshotKeys are the KEYS of snapshot.lua.
func (k roomKeys) snapshotKeys() []string { return []string{k.z, k.s, k.m, k.st, k.u} }

// rosterKeys are the KEYS of roster.lua.
func (k roomKeys) rosterKeys() []string { return []string{k.z, k.s, k.m, k.st} }

// sessionsKeys are the KEYS of sessions.lua.
func (k roomKeys) sessionsKeys() []string { return []string{k.s, k.st, k.z, k.u} }

// countKeys are the KEYS of count.lua.
func (k roomKeys) countKeys() []string { return []string{k.z} }

// touchKeys are the KEYS of one touch.lua call: the slot's reap index,
// change log, rooms with a grace and holders' last writes, then every
// room of the call in the order of its arguments.
type touchKeys []string

// touchSlotKeys is how many slot keys a touch call starts with.
const touchSlotKeys = 4

func newTouchKeys(index string) touchKeys {
	return touchKeys{index, changesKey(index), gracesKey(index), writesKey(index)}
}

// add appends a room's z and s: touch.lua names the room's other keys
// from z (room_of in lib.lua), as roomKeys does.
func (t touchKeys) add(k roomKeys) touchKeys { return append(t, k.z, k.s) }

// indexKey is the reap index for a room. On a cluster there is one per
// slot, keyed to live in that slot; otherwise one for all rooms.
func (s *Store) indexKey(room string) string {
	if !s.cluster {
		return s.opt.Prefix + ":reap"
	}
	return s.indexKeyOfSlot(slotOf(room))
}

func (s *Store) indexKeyOfSlot(slot int) string {
	return s.opt.Prefix + ":reap:{" + slotTags[slot] + "}"
}

// changesKey is the change log of the slot whose reap index is index
// (mark in lib.lua; read by changes.lua), in the same slot.
func changesKey(index string) string { return index + ":chg" }

// gracesKey is the set of the rooms of the slot whose index is index
// that may have a grace running (release.lua adds them; touch.lua looks
// at g only for those), in the same slot.
func gracesKey(index string) string { return index + ":g" }

// writesKey is the hash of the slot whose index is index that holds,
// per holder code, when that holder's last touch ran in the slot (Redis
// ms; touch.lua writes it, release and the reaper read it to date a
// session's last refresh), in the same slot.
func writesKey(index string) string { return index + ":w" }

// sweptSuffix names a master's sweep marker: its first slot index key
// plus this suffix, in the same slot.
const sweptSuffix = ":swept"

// sweptKey is the sweep marker of the master whose first slot index is
// index.
func sweptKey(index string) string { return index + sweptSuffix }

// clockKey is the region's clock hash. On a cluster it lives on one
// master: a sweep that cannot read it settles nothing.
func (s *Store) clockKey() string { return s.opt.Prefix + ":clock" }

// seenKey is the bucket hash holding a user's last-seen time.
func (s *Store) seenKey(user string) string {
	b := crc32.ChecksumIEEE([]byte(user)) % uint32(s.opt.LastSeenBuckets)
	return s.opt.Prefix + ":seen:{" + strconv.FormatUint(uint64(b), 10) + "}"
}
