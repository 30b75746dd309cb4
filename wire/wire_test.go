package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	frames := []Frame{{Stdout, []byte("hello")}, {Stderr, nil}, {Exit, []byte(`{"exit_code":0}`)}}
	for _, f := range frames {
		if err := w.Write(f.Type, f.Payload); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(&buf)
	for i, want := range frames {
		got, err := r.Read()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if got.Type != want.Type || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("frame %d = %d %q, want %d %q", i, got.Type, got.Payload, want.Type, want.Payload)
		}
	}
	if _, err := r.Read(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestHostileFrames(t *testing.T) {
	// A header announcing more than MaxPayload is refused before any
	// allocation.
	huge := []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}
	if _, err := NewReader(bytes.NewReader(huge)).Read(); err == nil {
		t.Fatal("oversized frame accepted")
	}
	// A frame cut short is an unexpected EOF, not a clean end.
	cut := AppendFrame(nil, Stdout, []byte("hello"))[:10]
	if _, err := NewReader(bytes.NewReader(cut)).Read(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut frame: %v, want io.ErrUnexpectedEOF", err)
	}
	if err := NewWriter(io.Discard).Write(Stdout, make([]byte, MaxPayload+1)); err == nil {
		t.Fatal("writer accepted an oversized payload")
	}
}
