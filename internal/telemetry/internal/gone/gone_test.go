package gone

import (
	"fmt"
	"strings"
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

// Ids of every length are told apart: those short enough to be held
// whole and those held by their hash, including a long id whose prefix
// is a short one.
func TestSetLongIDs(t *testing.T) {
	var s Set
	short := strings.Repeat("a", len(key{})-2)
	long := short + "bcdefghijklmnopqrstuvwxyz0123456789"
	longer := long + "x"
	s.Add(short)
	s.Add(long)
	if !s.Has(short) || !s.Has(long) || s.Has(longer) || s.Has(short[:len(short)-1]) || s.Len() != 2 {
		t.Fatalf("has short %v, long %v, longer %v, shorter %v, len %d; want the first two only",
			s.Has(short), s.Has(long), s.Has(longer), s.Has(short[:len(short)-1]), s.Len())
	}
	if s.Has("") {
		t.Fatal("the empty id is had without being added")
	}
}
