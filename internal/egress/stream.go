package egress

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"unicode/utf8"
)

// errPlaceholder is returned by a placeholderScanner that met a
// placeholder it must not let through.
type errPlaceholder struct{ name string }

func (e *errPlaceholder) Error() string {
	return "the request body carries the placeholder of secret " + e.name + " outside its scope"
}

// placeholderScanner passes a body through while looking for forbidden
// placeholders. It holds back the last placeholderLen-1 bytes until it
// knows they do not start one, so a placeholder it refuses is never
// released, not even in part; it buffers nothing more than one read.
type placeholderScanner struct {
	src       io.Reader
	forbidden map[string]string // placeholder → secret name
	buf       []byte            // buf[start:end] is read but not released
	start     int
	end       int
	checked   int // placeholder starts below this index were checked
	err       error
	n         int64
}

func newPlaceholderScanner(src io.Reader, forbidden map[string]string) *placeholderScanner {
	return &placeholderScanner{src: src, forbidden: forbidden, buf: make([]byte, 32<<10+placeholderLen)}
}

func (s *placeholderScanner) Read(p []byte) (int, error) {
	for {
		safe := s.end
		if s.err == nil {
			safe = s.end - (placeholderLen - 1)
		}
		if safe > s.start {
			n := copy(p, s.buf[s.start:safe])
			s.start += n
			s.n += int64(n)
			return n, nil
		}
		if s.err != nil {
			return 0, s.err
		}
		// Move what is held to the front and read more after it.
		if s.start > 0 {
			copy(s.buf, s.buf[s.start:s.end])
			s.end -= s.start
			s.checked -= s.start
			s.start = 0
			if s.checked < 0 {
				s.checked = 0
			}
		}
		m, err := s.src.Read(s.buf[s.end:])
		s.end += m
		if err != nil {
			s.err = err
		}
		if name, ok := s.scan(); ok {
			s.err = &errPlaceholder{name: name}
			s.end = s.start // release nothing of it
			return 0, s.err
		}
	}
}

// scan looks for forbidden placeholders that are whole in the buffer.
func (s *placeholderScanner) scan() (string, bool) {
	pre := []byte(PlaceholderPrefix)
	i := max(s.checked, s.start)
	for {
		j := bytes.Index(s.buf[i:s.end], pre)
		if j < 0 {
			s.checked = max(i, s.end-len(pre)+1)
			return "", false
		}
		i += j
		if i+placeholderLen > s.end {
			s.checked = i
			return "", false
		}
		if name, ok := s.forbidden[string(s.buf[i:i+placeholderLen])]; ok {
			return name, true
		}
		i++
	}
}

// replacement is one old → new of a scrubber: old is a literal, or re a
// pattern whose matches are at most longest bytes. fill replaces a match
// with as many '*'s instead of new.
type replacement struct {
	old []byte
	// re matches at the start of its input only; starts holds every byte
	// a match can begin with, so that re is tried only where one is.
	re     *regexp.Regexp
	starts string
	// lit is the raw first byte of a one-byte first character, which a
	// match can follow only with a byte of next (cheaper than re).
	lit     byte
	next    string
	longest int
	new     []byte
	fill    bool
}

// span is the longest text r replaces.
func (r replacement) span() int {
	if r.re != nil {
		return r.longest
	}
	return len(r.old)
}

// find returns the first match of r in b as [start, end), or -1.
func (r replacement) find(b []byte) (int, int) {
	if r.re != nil {
		for from := 0; from < len(b); {
			j := indexAnyByte(b[from:], r.starts)
			if j < 0 {
				break
			}
			k := from + j
			if r.next != "" && b[k] == r.lit && k+1 < len(b) && strings.IndexByte(r.next, b[k+1]) < 0 {
				from = k + 1
				continue
			}
			if loc := r.re.FindIndex(b[from+j:]); loc != nil {
				return from + j, from + j + loc[1]
			}
			from += j + 1
		}
		return -1, -1
	}
	j := bytes.Index(b, r.old)
	return j, j + len(r.old)
}

// indexAnyByte is the index of the first byte of b that is one of the
// bytes of set, or -1. bytes.IndexAny takes set as UTF-8 runes: a set
// holding the first byte of a multi-byte character (an escape start of a
// secret such as "ʍ…") would never match it.
func indexAnyByte(b []byte, set string) int {
	if isASCII(set) {
		return bytes.IndexAny(b, set) // its fast path for ASCII sets
	}
	for i, c := range b {
		if strings.IndexByte(set, c) >= 0 {
			return i
		}
	}
	return -1
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// sameLength returns reps that keep the length of what they replace.
func sameLength(reps []replacement) []replacement {
	out := make([]replacement, len(reps))
	for i, r := range reps {
		r.fill = true
		out[i] = r
	}
	return out
}

// scrubString is s with reps applied.
func scrubString(reps []replacement, s string) string {
	b, _ := io.ReadAll(newScrubber(io.NopCloser(strings.NewReader(s)), reps))
	return string(b)
}

// scrubber replaces every occurrence of the olds in a stream as it
// passes, holding back the longest old's length minus one, so that an
// occurrence split across reads is still found. Matches are taken
// leftmost first, longest first at one position.
type scrubber struct {
	src   io.ReadCloser
	reps  []replacement
	hold  int
	in    []byte
	out   []byte
	off   int // out[off:] is not yet read
	chunk []byte
	eof   bool
	err   error
}

func newScrubber(src io.ReadCloser, reps []replacement) *scrubber {
	hold := 0
	for _, r := range reps {
		hold = max(hold, r.span()-1)
	}
	return &scrubber{src: src, reps: reps, hold: hold, chunk: make([]byte, 32<<10)}
}

func (s *scrubber) Read(p []byte) (int, error) {
	for s.off == len(s.out) {
		s.out, s.off = s.out[:0], 0
		if s.eof && len(s.in) == 0 {
			return 0, s.err
		}
		if !s.eof {
			m, err := s.src.Read(s.chunk)
			s.in = append(s.in, s.chunk[:m]...)
			if err != nil {
				s.eof, s.err = true, err
			}
		}
		s.process()
	}
	n := copy(p, s.out[s.off:])
	s.off += n
	return n, nil
}

func (s *scrubber) process() {
	limit := len(s.in) // matches must start below limit to be whole
	if !s.eof {
		limit = len(s.in) - s.hold
	}
	i := 0
	for i < limit {
		best, bestEnd, bestRep := -1, -1, -1
		for k, r := range s.reps {
			j, end := r.find(s.in[i:])
			if j < 0 || i+j >= limit {
				continue
			}
			if best < 0 || j < best || j == best && end > bestEnd {
				best, bestEnd, bestRep = j, end, k
			}
		}
		if best < 0 {
			break
		}
		s.out = append(s.out, s.in[i:i+best]...)
		if r := s.reps[bestRep]; r.fill {
			s.out = append(s.out, bytes.Repeat([]byte{'*'}, bestEnd-best)...)
		} else {
			s.out = append(s.out, r.new...)
		}
		i += bestEnd
	}
	if i < limit {
		s.out = append(s.out, s.in[i:limit]...)
		i = limit
	}
	s.in = append(s.in[:0], s.in[i:]...)
}

func (s *scrubber) Close() error { return s.src.Close() }

// scrubConn scrubs what is read from an upgraded connection (a
// WebSocket): replacements keep their length there, because frames
// carry lengths.
type scrubConn struct {
	io.ReadWriteCloser
	s *scrubber
}

func (c *scrubConn) Read(p []byte) (int, error) { return c.s.Read(p) }

// countingReader counts what passes.
type countingReader struct {
	io.ReadCloser
	n *int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	*c.n += int64(n)
	return n, err
}
