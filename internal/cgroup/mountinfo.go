package cgroup

import (
	"bytes"
	"strings"
)

// v1Controllers are the only v1 controllers paddock uses.
var v1Controllers = []string{"cpu", "cpuacct", "memory", "pids", "freezer"}

// cgroupMounts is where the hierarchies are mounted.
type cgroupMounts struct {
	v1 map[string]string // controller name → mount point, for v1Controllers only
	v2 string            // the cgroup2 mount point, "" if none
}

// parseMountinfo finds the cgroup mounts in the contents of
// /proc/self/mountinfo (proc(5)). Where a hierarchy is mounted more than
// once, the first mount wins; for cgroup2, a mount of the hierarchy's root
// wins over a mount of a subtree.
func parseMountinfo(b []byte) cgroupMounts {
	m := cgroupMounts{v1: make(map[string]string)}
	v2Root := false
	for len(b) > 0 {
		var line []byte
		line, b = cutLine(b)
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := bytes.Cut(line, []byte(" - "))
		if !ok {
			continue
		}
		fields := strings.Fields(string(pre))
		tail := strings.Fields(string(post))
		if len(fields) < 5 || len(tail) < 3 {
			continue
		}
		root, point := fields[3], unescapeMountPath(fields[4])
		switch tail[0] {
		case "cgroup2":
			if m.v2 == "" || (!v2Root && root == "/") {
				m.v2, v2Root = point, root == "/"
			}
		case "cgroup":
			for _, opt := range strings.Split(tail[2], ",") {
				for _, c := range v1Controllers {
					if opt == c {
						if _, seen := m.v1[c]; !seen {
							m.v1[c] = point
						}
					}
				}
			}
		}
	}
	return m
}

// unescapeMountPath undoes the octal escapes (\040 for a space, ...) the
// kernel writes for whitespace and backslashes in mountinfo paths.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
