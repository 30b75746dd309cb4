package gone

import (
	"fmt"
	"testing"
)

// TestSet: the last Keep ids added are remembered, the oldest forgotten
// past that, and an id added twice counts once.
func TestSet(t *testing.T) {
	var s Set
	if s.Has("a") || s.Len() != 0 {
		t.Fatal("an empty set holds something")
	}
	s.Add("a")
	s.Add("a")
	if !s.Has("a") || s.Len() != 1 {
		t.Fatalf("after adding a twice: has %v, len %d", s.Has("a"), s.Len())
	}
	for i := range Keep - 1 {
		s.Add(fmt.Sprint(i))
	}
	if !s.Has("a") || s.Len() != Keep {
		t.Fatalf("full: has a %v, len %d", s.Has("a"), s.Len())
	}
	s.Add("b")
	if s.Has("a") || !s.Has("b") || !s.Has("0") || s.Len() != Keep {
		t.Fatalf("one past full: has a %v, b %v, 0 %v, len %d; want the oldest (a) forgotten", s.Has("a"), s.Has("b"), s.Has("0"), s.Len())
	}
}
