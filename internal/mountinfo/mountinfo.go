// Package mountinfo owns the reading of /proc/PID/mountinfo's fields
// (proc(5)) that several packages parse.
package mountinfo

import (
	"strconv"
	"strings"
)

// Unescape undoes the octal escapes the kernel writes for whitespace and
// backslashes in a mountinfo path (\040 for a space, \134 for a
// backslash). A backslash not followed by three octal digits of a byte
// stays as it is.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Mount is one line of mountinfo, the fields paddock reads, unescaped
// but for SuperOpts (a comma-separated list).
type Mount struct {
	Root, Point, FSType, Source, SuperOpts string
}

// Parse reads one line of mountinfo:
//
//	ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
//
// ok is false for a line that is not one (the empty last line, say).
func Parse(line string) (m Mount, ok bool) {
	pre, post, ok := strings.Cut(line, " - ")
	if !ok {
		return Mount{}, false
	}
	f, tail := strings.Fields(pre), strings.Fields(post)
	if len(f) < 5 || len(tail) < 3 {
		return Mount{}, false
	}
	return Mount{Root: Unescape(f[3]), Point: Unescape(f[4]), FSType: tail[0], Source: Unescape(tail[1]), SuperOpts: tail[2]}, true
}
