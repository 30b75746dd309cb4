package freeport

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// TestPorts: ports are distinct, outside the ephemeral range, bindable by
// whoever they are handed to, and never handed out twice.
func TestPorts(t *testing.T) {
	lo, hi, err := span()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for range 3 {
		ps, err := Ports(20)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p < lo || p >= hi {
				t.Fatalf("port %d outside %d-%d", p, lo, hi-1)
			}
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			seen[p] = true
			l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Fatalf("port %d: %v", p, err)
			}
			defer l.Close()
		}
	}
	// A port something listens on is skipped.
	q := lo + 700
	l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(q)))
	if err != nil {
		t.Skipf("port %d is in use already: %v", q, err)
	}
	defer l.Close()
	skips(t, q, "a listener held it")
	a, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	if la, err := net.Listen("tcp4", a); err != nil || !strings.HasPrefix(a, "127.0.0.1:") {
		t.Fatalf("Addr gave %q: %v", a, err)
	} else {
		la.Close()
	}
}

// skips checks that a search starting at port p passes it over.
func skips(t *testing.T, p int, why string) {
	t.Helper()
	mu.Lock()
	next = p
	mu.Unlock()
	got, err := Ports(1)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] == p {
		t.Fatalf("port %d handed out while %s", p, why)
	}
}

// TestReservedAcrossProcesses: a port another holder reserved is skipped.
func TestReservedAcrossProcesses(t *testing.T) {
	lo, _, err := span()
	if err != nil {
		t.Fatal(err)
	}
	// Find a port nobody holds, reserve it as another process would, and
	// point the cursor at it.
	p := lo + 500
	r, err := net.Listen("unix", "@paddock-freeport-"+strconv.Itoa(p))
	if err != nil {
		t.Skipf("port %d is reserved already: %v", p, err)
	}
	defer r.Close()
	skips(t, p, "another holder reserved it")
}
