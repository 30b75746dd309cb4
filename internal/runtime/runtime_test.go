package runtime

import (
	"strings"
	"testing"
)

// TestNewIDPrefix: a node's tag starts every id, which keeps 12
// characters; a bad tag is refused.
func TestNewIDPrefix(t *testing.T) {
	defer SetIDPrefix("")
	if err := SetIDPrefix("n7"); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 1000 {
		id := NewID()
		if len(id) != 12 || !strings.HasPrefix(id, "n7") || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789") != "" || seen[id] {
			t.Fatalf("id %q", id)
		}
		seen[id] = true
	}
	for _, bad := range []string{"N7", "abcde", "a-b", "a/"} {
		if SetIDPrefix(bad) == nil {
			t.Errorf("SetIDPrefix(%q) accepted", bad)
		}
	}
}
