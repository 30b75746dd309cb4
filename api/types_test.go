package api

import (
	"regexp"
	"strings"
	"testing"
)

// TestIsSandboxID: the hand-written check accepts exactly what the id
// pattern it replaced did.
func TestIsSandboxID(t *testing.T) {
	pattern := regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)
	cases := []string{
		"", "a", "0", "-", "-a", "a-", "abc123", "l4impfyqx5wx", "ABC", "a_b", "a.b", "a/b",
		"../x", "a b", "a\x00", "é", "a\n", strings.Repeat("a", 64), strings.Repeat("a", 65),
		"0-" + strings.Repeat("z", 62), "x" + strings.Repeat("-", 63),
	}
	// Every one- and two-byte string, so that no byte slips through.
	for a := 0; a < 256; a++ {
		cases = append(cases, string([]byte{byte(a)}), string([]byte{'a', byte(a)}))
	}
	for _, id := range cases {
		if got, want := IsSandboxID(id), pattern.MatchString(id); got != want {
			t.Errorf("IsSandboxID(%q) = %v, the pattern says %v", id, got, want)
		}
	}
}

// TestIsContainerName: names that cannot be split out of a container's
// runtime id (ID--NAME) or name a file badly are refused.
func TestIsContainerName(t *testing.T) {
	for name, want := range map[string]bool{
		"web": true, "a": true, "tools-2": true, "a-b-c": true, strings.Repeat("a", MaxContainerName): true,
		"": false, "2a": false, "-a": false, "a-": false, "a--b": false, "A": false, "a_b": false,
		"a.b": false, "a/b": false, "a b": false, strings.Repeat("a", MaxContainerName+1): false,
	} {
		if got := IsContainerName(name); got != want {
			t.Errorf("IsContainerName(%q) = %v, want %v", name, got, want)
		}
	}
}
