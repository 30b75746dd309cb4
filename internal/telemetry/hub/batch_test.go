package hub

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/wire"
)

// describe renders what take returns: the bytes skipped first, then each
// span as kind[from,to) (data spans with their first byte).
func describe(skip int64, spans []span) string {
	var b strings.Builder
	fmt.Fprintf(&b, "skip %d", skip)
	for _, s := range spans {
		switch s.kind {
		case spanData:
			if int64(len(s.p)) != s.n {
				return fmt.Sprintf("data span of %d bytes holds %d", s.n, len(s.p))
			}
			fmt.Fprintf(&b, " data%d[%d,%d)%c", s.t, s.off, s.off+s.n, s.p[0])
		case spanFetch:
			fmt.Fprintf(&b, " fetch[%d,%d)", s.off, s.off+s.n)
		case spanLost:
			fmt.Fprintf(&b, " lost[%d,%d)", s.off, s.off+s.n)
		}
	}
	return b.String()
}

// TestBatch: a batch holds the newest keep bytes of the output since the
// last write, in offset order, whether in hand, to fetch or lost; every
// byte before them is counted as skipped, so that the log's offsets stay
// the stream's.
func TestBatch(t *testing.T) {
	data := func(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }
	tests := []struct {
		name   string
		logged int64
		ops    func(b *batch)
		all    bool
		want   string
		after  string // a second take(true), when set
		logAt  int64  // logged after the first take
	}{
		{
			name: "output in hand, within the cap",
			ops: func(b *batch) {
				b.add(wire.Stdout, 0, data('a', 10))
				b.add(wire.Stderr, 10, data('b', 5))
			},
			all: true, logAt: 15,
			want: "skip 0 data1[0,10)a data2[10,15)b",
		},
		{
			name: "output pushed past the cap is skipped, the newest kept to the byte",
			ops: func(b *batch) {
				for i, c := range []byte("abcd") {
					b.add(wire.Stdout, int64(i*40), data(c, 40))
				}
			},
			all: true, logAt: 160,
			want: "skip 60 data1[60,80)b data1[80,120)c data1[120,160)d",
		},
		{
			name: "counted output: only what the cap leaves of it is fetched",
			ops: func(b *batch) {
				b.add(wire.Stdout, 0, data('a', 30))
				b.fetch(1000)
			},
			all: true, logAt: 1000,
			want: "skip 900 fetch[900,1000)",
		},
		{
			name: "a copied frame arriving after the count that covered it is left out",
			ops: func(b *batch) {
				b.fetch(50)
				b.add(wire.Stdout, 20, data('a', 10)) // within the count
				b.add(wire.Stdout, 40, data('b', 20)) // half within
				b.add(wire.Stderr, 70, data('c', 10)) // after a gap
			},
			all: true, logAt: 80,
			want: "skip 0 fetch[0,50) data1[50,60)b fetch[60,70) data2[70,80)c",
		},
		{
			name: "lost output keeps its place",
			ops: func(b *batch) {
				b.add(wire.Stdout, 0, data('a', 10))
				b.lost(30)
				b.add(wire.Stdout, 30, data('b', 10))
			},
			all: true, logAt: 40,
			want: "skip 0 data1[0,10)a lost[10,30) data1[30,40)b",
		},
		{
			name:   "a batch after earlier writes starts where the log is",
			logged: 500,
			ops: func(b *batch) {
				b.add(wire.Stdout, 400, data('a', 150)) // partly written already
				b.fetch(600)
			},
			all: true, logAt: 600,
			want: "skip 0 data1[500,550)a fetch[550,600)",
		},
		{
			name: "a stopping daemon writes what is in hand and leaves the fetch",
			ops: func(b *batch) {
				b.add(wire.Stdout, 0, data('a', 10))
				b.fetch(50)
				b.add(wire.Stdout, 50, data('b', 10))
			},
			logAt: 10,
			want:  "skip 0 data1[0,10)a",
			after: "skip 0 fetch[10,50) data1[50,60)b",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBatch(tt.logged, 100)
			tt.ops(b)
			if got := describe(b.take(tt.all)); got != tt.want {
				t.Errorf("take: %s\nwant: %s", got, tt.want)
			}
			if b.logged != tt.logAt {
				t.Errorf("logged %d after take, want %d", b.logged, tt.logAt)
			}
			if tt.after != "" {
				if got := describe(b.take(true)); got != tt.after {
					t.Errorf("second take: %s\nwant: %s", got, tt.after)
				}
			}
			if !b.empty() {
				t.Errorf("batch not empty after taking all")
			}
		})
	}
}
