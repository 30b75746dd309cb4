package e2b

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// The Connect protocol (connectrpc.com), JSON codec only, as envd speaks
// it: a unary call is a POST of one JSON message answered by one JSON
// message (or a non-200 status with an error object); a server-streaming
// call is a POST of one enveloped message answered by enveloped messages,
// the last one flagged as the end of the stream.

const (
	contentUnary  = "application/json"
	contentStream = "application/connect+json"
	// maxMessage bounds a request message.
	maxMessage = 1 << 20
	// flagEndStream marks the envelope that ends a stream.
	flagEndStream = 0x02
	// flagCompressed marks a compressed envelope; none is accepted.
	flagCompressed = 0x01
)

// rpcError is a Connect error: a code name from the protocol's fixed list
// and a message.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

// connectCode names the Connect code of err, from its paddock category.
func connectCode(err error) string {
	var re *rpcError
	switch {
	case errors.As(err, &re):
		return re.Code
	case errors.Is(err, errdefs.ErrNotFound):
		return "not_found"
	case errors.Is(err, errdefs.ErrInvalid):
		return "invalid_argument"
	case errors.Is(err, errdefs.ErrConflict):
		return "failed_precondition"
	case errors.Is(err, errdefs.ErrDenied):
		return "permission_denied"
	case errors.Is(err, errdefs.ErrTooLarge), errdefs.IsNoSpace(err):
		return "resource_exhausted"
	case errors.Is(err, errdefs.ErrUnavailable):
		return "unavailable"
	}
	return "internal"
}

// connectStatus is the HTTP status of a unary error, from the table in
// the Connect protocol's specification.
var connectStatus = map[string]int{
	"canceled": 499, "unknown": 500, "invalid_argument": 400,
	"deadline_exceeded": 504, "not_found": 404, "already_exists": 409,
	"permission_denied": 403, "resource_exhausted": 429,
	"failed_precondition": 400, "aborted": 409, "out_of_range": 400,
	"unimplemented": 501, "internal": 500, "unavailable": 503,
	"data_loss": 500, "unauthenticated": 401,
}

// errorBody turns err into the error object the client sees; internal
// errors are logged and reach the client without their detail.
func (s *Server) errorBody(r *http.Request, err error) rpcError {
	e := rpcError{Code: connectCode(err), Message: err.Error()}
	if e.Code == "internal" {
		s.log.Error("envd call failed", "path", r.URL.Path, "err", err)
		e.Message = "internal error; see the daemon log"
	}
	return e
}

// unary serves a unary call: the request message is decoded into req,
// call answers with the response message or an error.
func unary[Req any](s *Server, call func(*http.Request, *Req) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if err := decodeUnary(w, r, &req); err != nil {
			s.writeUnaryError(w, r, err)
			return
		}
		resp, err := call(r, &req)
		if err != nil {
			s.writeUnaryError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", contentUnary)
		w.WriteHeader(http.StatusOK)
		json.NewEncoder(w).Encode(resp)
	}
}

func decodeUnary(w http.ResponseWriter, r *http.Request, v any) error {
	if r.Method != http.MethodPost {
		return &rpcError{Code: "unimplemented", Message: "Connect calls are POSTs"}
	}
	ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	if strings.TrimSpace(ct) != contentUnary {
		return &rpcError{Code: "invalid_argument", Message: fmt.Sprintf("content type %q is not %s (only the JSON codec is served)", ct, contentUnary)}
	}
	if enc := r.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		return &rpcError{Code: "unimplemented", Message: fmt.Sprintf("content encoding %q is not supported", enc)}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxMessage))
	if err != nil {
		return &rpcError{Code: "resource_exhausted", Message: fmt.Sprintf("request message exceeds %d bytes", maxMessage)}
	}
	return decodeMessage(body, v)
}

// decodeMessage reads a proto3 JSON message. Unknown fields are ignored,
// as proto3 JSON parsers do by default, so that newer SDKs keep working.
func decodeMessage(body []byte, v any) error {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return &rpcError{Code: "invalid_argument", Message: "malformed request message: " + err.Error()}
	}
	return nil
}

func (s *Server) writeUnaryError(w http.ResponseWriter, r *http.Request, err error) {
	e := s.errorBody(r, err)
	code, ok := connectStatus[e.Code]
	if !ok {
		code = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", contentUnary)
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(e)
}

// stream is the response side of a server-streaming call.
type stream struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	mu    sync.Mutex
	begun bool
	ended bool
	buf   []byte
}

// openStream reads the enveloped request message of a streaming call into
// req and returns the response stream (not yet begun: an error before the
// first message can still be sent as the stream's only envelope).
func openStream(w http.ResponseWriter, r *http.Request, req any) (*stream, error) {
	st := &stream{w: w, rc: http.NewResponseController(w)}
	if r.Method != http.MethodPost {
		return st, &rpcError{Code: "unimplemented", Message: "Connect calls are POSTs"}
	}
	ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	if strings.TrimSpace(ct) != contentStream {
		return st, &rpcError{Code: "invalid_argument", Message: fmt.Sprintf("content type %q is not %s", ct, contentStream)}
	}
	var hdr [5]byte
	body := http.MaxBytesReader(w, r.Body, maxMessage+5)
	if _, err := io.ReadFull(body, hdr[:]); err != nil {
		return st, &rpcError{Code: "invalid_argument", Message: "missing request envelope"}
	}
	if hdr[0]&flagCompressed != 0 {
		return st, &rpcError{Code: "unimplemented", Message: "compressed messages are not supported"}
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxMessage {
		return st, &rpcError{Code: "resource_exhausted", Message: fmt.Sprintf("request message exceeds %d bytes", maxMessage)}
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(body, msg); err != nil {
		return st, &rpcError{Code: "invalid_argument", Message: "truncated request envelope"}
	}
	return st, decodeMessage(msg, req)
}

func (st *stream) beginLocked() {
	if st.begun {
		return
	}
	st.begun = true
	st.w.Header().Set("Content-Type", contentStream)
	st.w.WriteHeader(http.StatusOK)
}

// send writes one message and flushes it.
func (st *stream) send(msg any) error { return st.write(msg, true) }

// write writes one message, flushing it if asked: a message that more
// follow at once (buffered output, the end event before the end of the
// stream) goes out with them.
func (st *stream) write(msg any, flush bool) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	return st.envelope(0, b, flush)
}

func (st *stream) envelope(flag byte, b []byte, flush bool) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return errors.New("stream ended")
	}
	st.beginLocked()
	st.buf = append(st.buf[:0], flag, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(st.buf[1:5], uint32(len(b)))
	st.buf = append(st.buf, b...)
	if _, err := st.w.Write(st.buf); err != nil {
		return err
	}
	if flag == flagEndStream {
		st.ended = true
	}
	if !flush {
		return nil
	}
	return st.rc.Flush()
}

// end writes the end-of-stream envelope: {} or the error.
func (st *stream) end(s *Server, r *http.Request, err error) {
	body := []byte("{}")
	if err != nil {
		e := s.errorBody(r, err)
		body, _ = json.Marshal(map[string]any{"error": e})
	}
	st.envelope(flagEndStream, body, true)
}

// keepalive sends msg every interval, so that proxies and the SDK do not
// cut a quiet stream, until the returned func is called; that func waits
// for the sender to stop, so that nothing is written after the handler
// returns.
func (st *stream) keepalive(interval time.Duration, msg any) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				if st.send(msg) != nil {
					return
				}
			}
		}
	}()
	return func() {
		close(quit)
		wg.Wait()
	}
}

// keepaliveInterval reads the SDK's Keepalive-Ping-Interval header
// (seconds), bounded to [1 s, 60 s]; 50 s without one.
func keepaliveInterval(r *http.Request) time.Duration {
	d := 50 * time.Second
	var n int
	if _, err := fmt.Sscanf(r.Header.Get("Keepalive-Ping-Interval"), "%d", &n); err == nil && n > 0 {
		d = time.Duration(n) * time.Second
	}
	return min(max(d, time.Second), 60*time.Second)
}
