package sandbox

import (
	"io"
	"log/slog"
	"testing"
)

// TestRebaseMovesTheRange: a sandbox started again on a guest that
// brought its own uid range owns that range afterwards, and its old one is
// free for the next Alloc; a range held by another sandbox is never freed.
func TestRebaseMovesTheRange(t *testing.T) {
	m := NewManager(Config{UIDStart: 1 << 20, MaxSandboxes: 4, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer m.Close()
	old, err := m.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	b := &box{rec: record{UIDBase: old}}
	b.rec.ID = "aaaaaaaaaaaa"
	m.slots[m.slotOf(old)] = b.rec.ID
	other, err := m.Alloc() // a blank guest's range
	if err != nil {
		t.Fatal(err)
	}
	m.rebase(b, other)
	if b.rec.UIDBase != other || m.slots[m.slotOf(other)] != b.rec.ID {
		t.Fatalf("after rebase: record %d, slots %v", b.rec.UIDBase, m.slots)
	}
	if got, err := m.Alloc(); err != nil || got != old {
		t.Fatalf("Alloc after rebase = %d, %v; want the freed %d", got, err, old)
	}
	// The old range now belongs to someone else: a second rebase of b must
	// leave it alone.
	m.slots[m.slotOf(old)] = "bbbbbbbbbbbb"
	third, _ := m.Alloc()
	m.rebase(b, third)
	if m.slots[m.slotOf(old)] != "bbbbbbbbbbbb" {
		t.Fatalf("rebase freed another sandbox's range: %v", m.slots)
	}
	if _, held := m.slots[m.slotOf(other)]; held {
		t.Fatalf("rebase kept the range it left: %v", m.slots)
	}
}
