// Package gone remembers the sandboxes whose telemetry was removed
// lately, so that the logs can refuse their stragglers: a write that
// races a sandbox's removal (an exec's exit its output copy reaches after
// the teardown, an exec's start recorded behind its answer) would make
// the sandbox's log again, a file no sandbox owns. Sandbox ids are never
// reused, so a removed id stays removed; only the last Keep are kept.
package gone

import "crypto/sha256"

// Keep is how many removed sandboxes a Set remembers: a straggler comes
// within seconds of its sandbox's removal, by when at 200 removals a
// second this many have not passed.
const Keep = 1024

// key is an id held by value: an id of up to len(key)-1 bytes itself and
// its length, a longer one its SHA-256 (with a length byte no short id
// has). A Set keeps no pointer into the id strings it was given: each was
// made with its sandbox, among that sandbox's other small objects, and
// a thousand of them held after their sandboxes were removed kept as many
// of the Go heap's spans from being freed (issue 21: the daemon's RSS
// after a thousand sandboxes were removed).
type key [33]byte

func keyOf(id string) key {
	var k key
	if len(id) < len(k) {
		k[0] = byte(len(id))
		copy(k[1:], id)
		return k
	}
	k[0] = 0xff
	sum := sha256.Sum256([]byte(id))
	copy(k[1:], sum[:])
	return k
}

// Set is the last Keep removed sandbox ids. The zero value is empty and
// ready to use. It has no lock of its own: its users look at it and add
// to it under the lock with which they make and drop their sandboxes'
// state, which is what makes a refusal exact.
type Set struct {
	ids  map[key]struct{}
	ring *[Keep]key // made with ids
	next int
}

// Add records that id was removed, forgetting the oldest past Keep.
func (s *Set) Add(id string) {
	k := keyOf(id)
	if _, ok := s.ids[k]; ok {
		return
	}
	if s.ids == nil {
		s.ids = make(map[key]struct{}, Keep)
		s.ring = new([Keep]key)
	}
	if len(s.ids) == Keep {
		delete(s.ids, s.ring[s.next])
	}
	s.ring[s.next] = k
	s.next = (s.next + 1) % Keep
	s.ids[k] = struct{}{}
}

// Has reports whether id is among the last Keep removed.
func (s *Set) Has(id string) bool {
	_, ok := s.ids[keyOf(id)]
	return ok
}

// Len is how many ids the set holds.
func (s *Set) Len() int { return len(s.ids) }
