package wire

import (
	"bufio"
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

// TestWhole: a stream whose last frame is already read ahead is taken in
// one piece; one that is not, or a hostile length, leaves the reader as
// it was.
func TestWhole(t *testing.T) {
	stream := AppendFrame(nil, Stdout, []byte("out"))
	stream = AppendFrame(stream, Stderr, []byte("err"))
	stream = AppendFrame(stream, Exit, []byte(`{"exit_code":0}`))
	after := AppendFrame(nil, Stdout, []byte("next"))
	for _, tc := range []struct {
		name  string
		input []byte
		want  []byte // nil: not whole
	}{
		{"whole, then more", append(append([]byte(nil), stream...), after...), stream},
		{"whole", stream, stream},
		{"exit cut short", stream[:len(stream)-1], nil},
		{"no exit yet", stream[:len(stream)-HeaderSize-15], nil},
		{"hostile length", append(append([]byte(nil), stream[:HeaderSize+3]...), 3, 0, 0, 0, 0xff, 0xff, 0xff, 0xff), nil},
	} {
		br := bufio.NewReaderSize(bytes.NewReader(tc.input), 4096)
		br.Peek(len(tc.input)) // read ahead, as a relay's reader has
		r := NewReader(br)
		got := r.Whole(Exit)
		if !bytes.Equal(got, tc.want) {
			t.Errorf("%s: Whole = %q, want %q", tc.name, got, tc.want)
		}
		// What was not taken is still there, frame by frame.
		rest, _ := io.ReadAll(br)
		if want := tc.input[len(got):]; !bytes.Equal(rest, want) {
			t.Errorf("%s: left %q, want %q", tc.name, rest, want)
		}
	}
	if NewReader(bytes.NewReader(stream)).Whole(Exit) != nil {
		t.Error("Whole on an unbuffered reader took frames")
	}
}
