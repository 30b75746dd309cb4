package guest

import (
	"regexp"
	"testing"
)

// TestNewBootID: a boot id reads as the kernel's boot_id does (a version
// 4 UUID and a newline) and is new each time.
func TestNewBootID(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n$`)
	seen := map[string]bool{}
	for range 100 {
		id, err := newBootID()
		if err != nil {
			t.Fatal(err)
		}
		if !uuid.MatchString(id) {
			t.Fatalf("boot id %q is not a version 4 UUID", id)
		}
		if seen[id] {
			t.Fatalf("boot id %q came twice", id)
		}
		seen[id] = true
	}
}
