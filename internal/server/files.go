package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"syscall"

	"paddock/internal/errdefs"
	"paddock/internal/guest"
)

// fileRoutes are the /v1/sandboxes/{id}/files endpoints. Every path names
// a file inside the sandbox and is resolved there by the guest (relative
// paths against the sandbox's workdir). File bodies and tar streams are
// streamed both ways, never held whole in memory.
func (s *Server) fileRoutes() []route {
	return []route{
		{"GET /v1/sandboxes/{id}/files", s.readFile},
		{"PUT /v1/sandboxes/{id}/files", s.writeFile},
		{"GET /v1/sandboxes/{id}/files/stat", s.statFile},
		{"GET /v1/sandboxes/{id}/files/list", s.listFiles},
		{"POST /v1/sandboxes/{id}/files/mkdir", s.mkdir},
		{"POST /v1/sandboxes/{id}/files/remove", s.removeFile},
		{"POST /v1/sandboxes/{id}/files/move", s.moveFile},
		{"GET /v1/sandboxes/{id}/files/tar", s.downloadTar},
		{"PUT /v1/sandboxes/{id}/files/tar", s.uploadTar},
		{"GET /v1/sandboxes/{id}/files/watch", s.watchFiles},
	}
}

// Media types of the file endpoints.
const (
	octetStream = "application/octet-stream"
	tarType     = "application/x-tar"
	ndjsonType  = "application/x-ndjson"
)

// filePath checks a path argument: present, no NUL, at most PATH_MAX.
func filePath(field, p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Invalid(field, "required")
	case strings.IndexByte(p, 0) >= 0:
		return "", errdefs.Invalid(field, "contains a NUL byte")
	case len(p) > 4096:
		return "", errdefs.Invalid(field, "longer than 4096 bytes")
	}
	return p, nil
}

func queryPath(r *http.Request) (string, error) {
	return filePath("path", r.URL.Query().Get("path"))
}

func int64Param(r *http.Request, name string) (*int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return nil, errdefs.Invalid(name, "%q is not a non-negative integer", v)
	}
	return &n, nil
}

func modeArg(field, v string) (*guest.FileMode, error) {
	if v == "" {
		return nil, nil
	}
	m, err := guest.ParseFileMode(v)
	if err != nil {
		return nil, errdefs.Invalid(field, "%v", err)
	}
	return &m, nil
}

func ownerArg(field, v string) (string, error) {
	if len(v) > 256 || strings.ContainsAny(v, "\x00\n") {
		return "", errdefs.Invalid(field, "%q is not USER[:GROUP]", v)
	}
	return v, nil
}

// guestFor returns the guest of a running sandbox.
func (s *Server) guestFor(w http.ResponseWriter, r *http.Request) (*guest.Client, bool) {
	gc, err := s.mgr.Guest(r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return nil, false
	}
	return gc, true
}

// abortStream ends a response whose status is already sent: the
// connection is cut, so that the client sees a broken body (a short
// Content-Length or a chunked body with no end), never a complete-looking
// truncated file.
func (s *Server) abortStream(r *http.Request, err error) {
	level := slog.LevelWarn
	if r.Context().Err() != nil || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		level = slog.LevelDebug // the client went away
	}
	s.log.Log(r.Context(), level, "file stream cut", "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery, "err", err)
	panic(http.ErrAbortHandler)
}

// readFile streams a file's bytes: the whole file, or length bytes from
// offset. Content-Length is set when the size is known.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	var off, length *int64
	if err == nil {
		off, err = int64Param(r, "offset")
	}
	if err == nil {
		length, err = int64Param(r, "length")
	}
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, ok := s.guestFor(w, r)
	if !ok {
		return
	}
	fr := guest.FileRequest{Path: p, Length: length}
	if off != nil {
		fr.Offset = *off
	}
	resp, ds, err := gc.FileRead(r.Context(), guest.OpFileRead, fr)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	defer ds.Close()
	h := w.Header()
	h.Set("Content-Type", octetStream)
	if resp.Length >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.Length, 10))
	}
	if fi := resp.Info; fi != nil {
		h.Set("Last-Modified", fi.ModTime.UTC().Format(http.TimeFormat))
		h.Set("X-Paddock-File-Size", strconv.FormatInt(fi.Size, 10))
		h.Set("X-Paddock-File-Mode", fi.Mode.String())
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := ds.WriteTo(w); err != nil {
		s.abortStream(r, err)
	}
}

// writeFile writes the request body to a file atomically.
func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	var mode *guest.FileMode
	var owner string
	if err == nil {
		mode, err = modeArg("mode", r.URL.Query().Get("mode"))
	}
	if err == nil {
		owner, err = ownerArg("owner", r.URL.Query().Get("owner"))
	}
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, ok := s.guestFor(w, r)
	if !ok {
		return
	}
	end, err := gc.FileWrite(r.Context(), guest.OpFileWrite, guest.FileRequest{Path: p, Mode: mode, Owner: owner}, r.Body)
	if err != nil {
		writeError(w, r, s.log, bodyError(err))
		return
	}
	writeJSON(w, http.StatusOK, end.Info)
}

// bodyError names the request body when it is what failed.
func bodyError(err error) error {
	var se *guest.SourceError
	if errors.As(err, &se) {
		return errdefs.Invalid("body", "reading the request body: %v", se.Err)
	}
	return err
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, ok := s.guestFor(w, r)
	if !ok {
		return
	}
	resp, err := gc.FileDo(r.Context(), guest.OpFileStat, guest.FileRequest{Path: p})
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, resp.Info)
}

// listFiles answers a JSON array of entries, written as the guest walks.
func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	depth := 1
	if err == nil {
		var d *int64
		if d, err = int64Param(r, "depth"); err == nil && d != nil {
			if *d < 1 || *d > 1<<16 {
				err = errdefs.Invalid("depth", "%d is outside 1..65536", *d)
			} else {
				depth = int(*d)
			}
		}
	}
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, ok := s.guestFor(w, r)
	if !ok {
		return
	}
	ls, err := gc.FileList(r.Context(), guest.FileRequest{Path: p, Depth: depth})
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	defer ls.Close()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteByte('[')
	first := true
	for {
		batch, err := ls.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			s.abortStream(r, err)
		}
		for _, fi := range batch {
			b, _ := json.Marshal(fi)
			if !first {
				bw.WriteByte(',')
			}
			first = false
			if _, err := bw.Write(b); err != nil {
				s.abortStream(r, err)
			}
		}
	}
	bw.WriteString("]\n")
	if err := bw.Flush(); err != nil {
		s.abortStream(r, err)
	}
}

// mkdirRequest is the body of POST .../files/mkdir.
type mkdirRequest struct {
	Path    string `json:"path"`
	Parents bool   `json:"parents"`
	// Mode is octal, e.g. "0755".
	Mode  string `json:"mode"`
	Owner string `json:"owner"`
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req mkdirRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	p, err := filePath("path", req.Path)
	var mode *guest.FileMode
	if err == nil {
		mode, err = modeArg("mode", req.Mode)
	}
	if err == nil {
		_, err = ownerArg("owner", req.Owner)
	}
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, ok := s.guestFor(w, r)
	if !ok {
		return
	}
	resp, err := gc.FileDo(r.Context(), guest.OpFileMkdir, guest.FileRequest{Path: p, Parents: req.Parents, Mode: mode, Owner: req.Owner})
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, resp.Info)
}

// removeRequest is the body of POST .../files/remove.
type removeRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	var req removeRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	p, err := filePath("path", req.Path)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, ok := s.guestFor(w, r)
	if !ok {
		return
	}
	if _, err := gc.FileDo(r.Context(), guest.OpFileRemove, guest.FileRequest{Path: p, Recursive: req.Recursive}); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// moveRequest is the body of POST .../files/move.
type moveRequest struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Overwrite bool   `json:"overwrite"`
}

func (s *Server) moveFile(w http.ResponseWriter, r *http.Request) {
	var req moveRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	from, err := filePath("from", req.From)
	var to string
	if err == nil {
		to, err = filePath("to", req.To)
	}
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, ok := s.guestFor(w, r)
	if !ok {
		return
	}
	resp, err := gc.FileDo(r.Context(), guest.OpFileMove, guest.FileRequest{Path: from, To: to, Overwrite: req.Overwrite})
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, resp.Info)
}

// downloadTar streams a file or directory tree as a tar.
func (s *Server) downloadTar(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, ok := s.guestFor(w, r)
	if !ok {
		return
	}
	_, ds, err := gc.FileRead(r.Context(), guest.OpFileTarGet, guest.FileRequest{Path: p})
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	defer ds.Close()
	w.Header().Set("Content-Type", tarType)
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := ds.WriteTo(w); err != nil {
		s.abortStream(r, err)
	}
}

// TarResult is the answer to a tar upload.
type TarResult struct {
	// Entries is how many entries were extracted.
	Entries int64 `json:"entries"`
	// Bytes is the size of the tar stream received.
	Bytes int64 `json:"bytes"`
}

// uploadTar extracts the request body, a tar, into a directory (made,
// with its parents, if missing).
func (s *Server) uploadTar(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	var owner string
	if err == nil {
		owner, err = ownerArg("owner", r.URL.Query().Get("owner"))
	}
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, ok := s.guestFor(w, r)
	if !ok {
		return
	}
	end, err := gc.FileWrite(r.Context(), guest.OpFileTarPut, guest.FileRequest{Path: p, Owner: owner}, r.Body)
	if err != nil {
		writeError(w, r, s.log, bodyError(err))
		return
	}
	writeJSON(w, http.StatusOK, TarResult{Entries: end.Entries, Bytes: end.Bytes})
}

// watchEnd is the last line of a watch stream that the daemon ends: the
// directory went away, or the sandbox did.
type watchEnd struct {
	Type   string `json:"type"` // "end"
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// watchFiles streams a directory's changes as newline-delimited JSON, one
// event per line, until the client goes away. The answer's headers are
// sent once the watch is in place.
func (s *Server) watchFiles(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	var recursive bool
	if err == nil {
		recursive, err = boolParam(r, "recursive")
	}
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, ok := s.guestFor(w, r)
	if !ok {
		return
	}
	done, err := s.mgr.Done(r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	es, err := gc.FileWatch(r.Context(), guest.FileRequest{Path: p, Recursive: recursive})
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	defer es.Close()
	stop := context.AfterFunc(r.Context(), es.Abort)
	defer stop()
	w.Header().Set("Content-Type", ndjsonType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	enc := json.NewEncoder(w)
	for {
		ev, err := es.Next()
		if err != nil {
			if r.Context().Err() != nil {
				return
			}
			end := watchEnd{Type: "end"}
			var we *guest.WatchEnded
			switch {
			case errors.As(err, &we):
				end.Reason = we.Reason
			case errors.Is(err, guest.ErrStreamCut) && sandboxEnding(done):
				end.Error = "sandbox ended"
			default:
				end.Error = fmt.Sprint(err)
			}
			enc.Encode(end)
			rc.Flush()
			return
		}
		if err := enc.Encode(ev); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}
