// Package wire owns paddock's stream framing, used on every byte stream:
// between the daemon and a guest, and between the daemon and its clients.
//
// A frame is an 8-byte header followed by a payload:
//
//	byte 0     frame type
//	bytes 1-3  zero
//	bytes 4-7  payload length, big-endian uint32
//
// Output frames carry raw bytes; control frames carry JSON.
package wire

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
)

// Type is a frame type.
type Type byte

const (
	// Server to client.
	Stdout  Type = 1
	Stderr  Type = 2
	Exit    Type = 3 // JSON api.ExitStatus; the last frame of a stream
	Error   Type = 4 // JSON api.Error; the stream ends after it
	Started Type = 5 // JSON {"pid": N}
	Dropped Type = 6 // JSON {"bytes": N}: output lost to the retention cap
	Data    Type = 7 // raw bytes of a file or tar stream
	Event   Type = 8 // JSON event (file watch)
	End     Type = 9 // JSON; ends a data or event stream (e.g. {"bytes": N} or an error)

	// Client to server.
	Stdin      Type = 16
	CloseStdin Type = 17
	Signal     Type = 18 // JSON {"signal": "TERM"}
	Resize     Type = 19 // JSON {"cols": N, "rows": N}
	// Release ends a process stream from the client's side after its exit
	// frame: the connection then carries the client's next request
	// (daemon to guest only).
	Release Type = 20
)

// HeaderSize is the size of a frame header.
const HeaderSize = 8

// MaxPayload bounds a single frame so that a hostile peer cannot make the
// reader allocate without limit.
const MaxPayload = 4 << 20

// StreamSendBuffer is the send buffer of the unix socket connections that
// carry frame streams: guest to daemon, and daemon to a local client.
// With the kernel's default (208 KiB, less than one full output frame) the
// writer and the reader of a fast stream take turns at every frame; with
// more, each runs longer between switches. It bounds what one connection
// can have queued, not what it takes.
const StreamSendBuffer = 1 << 20

// SetSendBuffer sets StreamSendBuffer on c if it is a unix socket
// connection (TCP keeps the kernel's autotuning).
func SetSendBuffer(c net.Conn) {
	if uc, ok := c.(*net.UnixConn); ok {
		uc.SetWriteBuffer(StreamSendBuffer)
	}
}

// Frame is one decoded frame. Payload is only valid until the next Read on
// the Reader that returned it.
type Frame struct {
	Type    Type
	Payload []byte
}

// Writer writes frames. It is not safe for concurrent use.
type Writer struct {
	w   io.Writer
	hdr [HeaderSize]byte
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes one frame.
func (w *Writer) Write(t Type, payload []byte) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("frame payload of %d bytes exceeds %d", len(payload), MaxPayload)
	}
	w.hdr[0] = byte(t)
	binary.BigEndian.PutUint32(w.hdr[4:], uint32(len(payload)))
	if len(payload) == 0 {
		_, err := w.w.Write(w.hdr[:])
		return err
	}
	// One write (a writev on a connection): a peer woken by the header
	// alone would only wait again for the payload.
	bufs := net.Buffers{w.hdr[:], payload}
	_, err := bufs.WriteTo(w.w)
	return err
}

// WriteJSON writes one frame whose payload is v as JSON.
func (w *Writer) WriteJSON(t Type, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return w.Write(t, b)
}

// AppendFrame appends one encoded frame to dst and returns it, for callers
// that batch frames into a single write.
func AppendFrame(dst []byte, t Type, payload []byte) []byte {
	var hdr [HeaderSize]byte
	hdr[0] = byte(t)
	binary.BigEndian.PutUint32(hdr[4:], uint32(len(payload)))
	dst = append(dst, hdr[:]...)
	return append(dst, payload...)
}

// Reader reads frames.
type Reader struct {
	r   io.Reader
	hdr [HeaderSize]byte
	buf []byte
}

// NewReader returns a Reader on r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// Buffered reports how many bytes are already read ahead, when r is a
// *bufio.Reader (0 otherwise): a relay flushes when nothing more is
// pending.
func (r *Reader) Buffered() int {
	if b, ok := r.r.(interface{ Buffered() int }); ok {
		return b.Buffered()
	}
	return 0
}

// Whole returns the frames already read ahead, up to and including the
// first one of type last, and consumes them, when r reads from a
// *bufio.Reader and all of them are in its buffer; otherwise it returns
// nil and consumes nothing. A relay passes such a stream on in one write.
func (r *Reader) Whole(last Type) []byte {
	br, ok := r.r.(*bufio.Reader)
	if !ok {
		return nil
	}
	b, _ := br.Peek(br.Buffered())
	for i := 0; i+HeaderSize <= len(b); {
		n := binary.BigEndian.Uint32(b[i+4:])
		if n > MaxPayload || uint64(i)+HeaderSize+uint64(n) > uint64(len(b)) {
			return nil
		}
		end := i + HeaderSize + int(n)
		if Type(b[i]) == last {
			out := append([]byte(nil), b[:end]...)
			br.Discard(end)
			return out
		}
		i = end
	}
	return nil
}

// Read reads the next frame. It returns io.EOF only at a frame boundary and
// io.ErrUnexpectedEOF for a frame cut short.
func (r *Reader) Read() (Frame, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(r.hdr[4:])
	if n > MaxPayload {
		return Frame{}, fmt.Errorf("frame payload of %d bytes exceeds %d", n, MaxPayload)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	p := r.buf[:n]
	if _, err := io.ReadFull(r.r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return Frame{Type: Type(r.hdr[0]), Payload: p}, nil
}

// Frames of the daemon↔guest control protocol.
const (
	Request  Type = 32 // JSON guest request; the first frame on a guest connection
	Response Type = 33 // JSON guest response; the guest's answer to Request
)
