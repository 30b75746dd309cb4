package dns

import (
	"fmt"
	"math"
	"strings"
)

// canonical returns name in lower case without the trailing dot: the form
// policies, special names, the cache and the log use.
func canonical(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".")
}

// validName reports whether name (canonical) is a plausible host or
// service name: labels of letters, digits, '-' and '_' (SRV, DKIM), 1 to 63
// characters, 253 in all. Anything else (escaped bytes, spaces, the root)
// is refused before any policy sees it.
func validName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Thresholds of suspect: names that look like encoded data. They only
// mark the log entry: whether the name is answered is the policy's call.
const (
	suspectName    = 100 // characters in the whole name
	suspectLabel   = 32  // characters in one label (a hex SHA-256 half, base32 of 20 bytes)
	entropyLabel   = 20  // shortest label whose entropy is judged
	entropyPerChar = 4.0 // bits per character: base32 of random bytes is above at 24 characters, words below
)

// suspect says why name looks like data smuggled out through DNS, or "".
func suspect(name string) string {
	if len(name) > suspectName {
		return fmt.Sprintf("long name (%d characters)", len(name))
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) > suspectLabel {
			return fmt.Sprintf("long label (%d characters)", len(label))
		}
		if len(label) >= entropyLabel && entropy(label) > entropyPerChar {
			return fmt.Sprintf("high-entropy label %q", label)
		}
	}
	return ""
}

// entropy is the Shannon entropy of s in bits per character.
func entropy(s string) float64 {
	var counts [256]int
	for i := 0; i < len(s); i++ {
		counts[s[i]]++
	}
	h := 0.0
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / float64(len(s))
			h -= p * math.Log2(p)
		}
	}
	return h
}
