package hub

import (
	"bytes"
	"context"
	"testing"
	"time"

	"paddock/api"
	"paddock/internal/telemetry/execlog"
	"paddock/wire"
)

// TestBatchKeepsNewest: output pushed past the log's cap while held is
// skipped, never written; what is written is the newest output, in order,
// at the right offsets, with Dropped bytes counted where they fell.
func TestBatchKeepsNewest(t *testing.T) {
	st, err := execlog.Open(execlog.Config{Dir: t.TempDir(), MaxProcessBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	w, err := st.Start("sb", 7, []string{"cat"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b := newBatch(w, st.ProcessCap())
	chunk := func(c byte) []byte { return bytes.Repeat([]byte{c}, 16<<10) }
	for c := byte('a'); c <= 'h'; c++ { // 128 KiB: the first 4 chunks fall past the cap
		b.add(wire.Stdout, chunk(c))
	}
	if err := b.flush(); err != nil {
		t.Fatal(err)
	}
	b.dropped(1000)
	b.add(wire.Stderr, []byte("end"))
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(api.ExitStatus{}); err != nil {
		t.Fatal(err)
	}
	ps, err := st.List("sb")
	if err != nil || len(ps) != 1 {
		t.Fatalf("List: %v %v", ps, err)
	}
	if want := int64(128<<10 + 1000 + 3); ps[0].End != want {
		t.Errorf("log ends at %d, want %d (every byte counted, written or not)", ps[0].End, want)
	}
	// The log itself keeps between half its cap and its cap (two
	// segments); what it keeps must be the stream's newest bytes.
	var data []byte
	var offsets []int64
	var last []byte
	err = st.Read(context.Background(), "sb", ps[0].Seq, 0, false, func(c execlog.Chunk) error {
		offsets = append(offsets, c.Offset)
		last = append(last[:0], c.Data...)
		if c.Offset < 128<<10 {
			data = append(data, c.Data...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(offsets); n == 0 || offsets[n-1] != 128<<10+1000 || string(last) != "end" {
		t.Fatalf("last chunk %q at %v, want \"end\" at %d (after the dropped bytes)", last, offsets, 128<<10+1000)
	}
	var full []byte
	for c := byte('a'); c <= 'h'; c++ {
		full = append(full, chunk(c)...)
	}
	if len(data) < 32<<10 || !bytes.HasSuffix(full, data) || offsets[0] != int64(len(full)-len(data)) {
		t.Errorf("kept %d bytes from offset %d; want at least 32 KiB, the newest of the stream", len(data), offsets[0])
	}
}
