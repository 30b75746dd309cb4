package cluster

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"regexp"
	"strconv"
)

// TagLen is the length of a node's tag, the first characters of every
// sandbox id it mints: 36³ = 46,656 tags, and 36⁹ ids per node behind
// each.
const TagLen = 3

var tagPattern = regexp.MustCompile(`^[a-z0-9]{3}$`)

// ValidTag reports whether s is a well-formed node tag.
func ValidTag(s string) bool { return tagPattern.MatchString(s) }

// tagFor is the attempt-th candidate tag of the node named name: the same
// name always proposes the same tags in the same order, so a node whose
// record was lost proposes its old tag first.
func tagFor(name string, attempt int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	sum := sha256.Sum256([]byte(name + "\x00" + strconv.Itoa(attempt)))
	v := binary.BigEndian.Uint64(sum[:8])
	b := make([]byte, TagLen)
	for i := range b {
		b[i] = alphabet[v%uint64(len(alphabet))]
		v /= uint64(len(alphabet))
	}
	return string(b)
}

// nodeNamePattern is a Kubernetes object name (RFC 1123 subdomain), which
// both a PaddockNode and a Lease need.
var nodeNamePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// CheckNodeName says why name cannot name a node, or returns nil.
func CheckNodeName(name string) error {
	if len(name) == 0 || len(name) > 253 || !nodeNamePattern.MatchString(name) {
		return fmt.Errorf("node name %q: want lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters", name)
	}
	return nil
}
