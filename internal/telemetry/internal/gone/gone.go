// Package gone remembers the sandboxes whose telemetry was removed
// lately, so that the logs can refuse their stragglers: a write that
// races a sandbox's removal (an exec's exit its output copy reaches after
// the teardown, an exec's start recorded behind its answer) would make
// the sandbox's log again, a file no sandbox owns. Sandbox ids are never
// reused, so a removed id stays removed; only the last Keep are kept.
package gone

// Keep is how many removed sandboxes a Set remembers: a straggler comes
// within seconds of its sandbox's removal, by when at 200 removals a
// second this many have not passed.
const Keep = 1024

// Set is the last Keep removed sandbox ids. The zero value is empty and
// ready to use. It has no lock of its own: its users look at it and add
// to it under the lock with which they make and drop their sandboxes'
// state, which is what makes a refusal exact.
type Set struct {
	ids  map[string]struct{}
	ring [Keep]string
	next int
}

// Add records that id was removed, forgetting the oldest past Keep.
func (s *Set) Add(id string) {
	if _, ok := s.ids[id]; ok {
		return
	}
	if s.ids == nil {
		s.ids = make(map[string]struct{}, Keep)
	}
	if old := s.ring[s.next]; old != "" {
		delete(s.ids, old)
	}
	s.ring[s.next] = id
	s.next = (s.next + 1) % Keep
	s.ids[id] = struct{}{}
}

// Has reports whether id is among the last Keep removed.
func (s *Set) Has(id string) bool {
	_, ok := s.ids[id]
	return ok
}

// Len is how many ids the set holds.
func (s *Set) Len() int { return len(s.ids) }
