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

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
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

func modeArg(field, v string) (*api.FileMode, error) {
	if v == "" {
		return nil, nil
	}
	m, err := api.ParseFileMode(v)
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

// fileArgs reads the arguments of a file endpoint (from the query, or
// from a JSON body) into the request for the guest.
type fileArgs func(w http.ResponseWriter, r *http.Request) (guestapi.FileRequest, error)

// pathArgs reads the path of the ops that take nothing else.
func pathArgs(_ http.ResponseWriter, r *http.Request) (guestapi.FileRequest, error) {
	p, err := queryPath(r)
	return guestapi.FileRequest{Path: p}, err
}

func readArgs(_ http.ResponseWriter, r *http.Request) (guestapi.FileRequest, error) {
	p, err := queryPath(r)
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	off, err := int64Param(r, "offset")
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	length, err := int64Param(r, "length")
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	fr := guestapi.FileRequest{Path: p, Length: length}
	if off != nil {
		fr.Offset = *off
	}
	return fr, nil
}

func writeArgs(_ http.ResponseWriter, r *http.Request) (guestapi.FileRequest, error) {
	p, err := queryPath(r)
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	mode, err := modeArg("mode", r.URL.Query().Get("mode"))
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	owner, err := ownerArg("owner", r.URL.Query().Get("owner"))
	return guestapi.FileRequest{Path: p, Mode: mode, Owner: owner}, err
}

func listArgs(_ http.ResponseWriter, r *http.Request) (guestapi.FileRequest, error) {
	p, err := queryPath(r)
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	d, err := int64Param(r, "depth")
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	depth := 1
	if d != nil {
		if *d < 1 || *d > 1<<16 {
			return guestapi.FileRequest{}, errdefs.Invalid("depth", "%d is outside 1..65536", *d)
		}
		depth = int(*d)
	}
	return guestapi.FileRequest{Path: p, Depth: depth}, nil
}

func mkdirArgs(w http.ResponseWriter, r *http.Request) (guestapi.FileRequest, error) {
	var req api.MkdirRequest
	if err := decode(w, r, &req); err != nil {
		return guestapi.FileRequest{}, err
	}
	p, err := filePath("path", req.Path)
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	mode, err := modeArg("mode", req.Mode)
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	owner, err := ownerArg("owner", req.Owner)
	return guestapi.FileRequest{Path: p, Parents: req.Parents, Mode: mode, Owner: owner}, err
}

func removeArgs(w http.ResponseWriter, r *http.Request) (guestapi.FileRequest, error) {
	var req api.RemoveRequest
	if err := decode(w, r, &req); err != nil {
		return guestapi.FileRequest{}, err
	}
	p, err := filePath("path", req.Path)
	return guestapi.FileRequest{Path: p, Recursive: req.Recursive}, err
}

func moveArgs(w http.ResponseWriter, r *http.Request) (guestapi.FileRequest, error) {
	var req api.MoveRequest
	if err := decode(w, r, &req); err != nil {
		return guestapi.FileRequest{}, err
	}
	from, err := filePath("from", req.From)
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	to, err := filePath("to", req.To)
	return guestapi.FileRequest{Path: from, To: to, Overwrite: req.Overwrite}, err
}

func tarPutArgs(_ http.ResponseWriter, r *http.Request) (guestapi.FileRequest, error) {
	p, err := queryPath(r)
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	owner, err := ownerArg("owner", r.URL.Query().Get("owner"))
	return guestapi.FileRequest{Path: p, Owner: owner}, err
}

func watchArgs(_ http.ResponseWriter, r *http.Request) (guestapi.FileRequest, error) {
	p, err := queryPath(r)
	if err != nil {
		return guestapi.FileRequest{}, err
	}
	recursive, err := boolParam(r, "recursive")
	return guestapi.FileRequest{Path: p, Recursive: recursive}, err
}

// fileGuest reads a file request's arguments, then finds the guest of the
// running sandbox: bad arguments are refused before the sandbox is looked
// up. On error it has answered.
func (s *Server) fileGuest(w http.ResponseWriter, r *http.Request, args fileArgs) (*guestapi.Client, guestapi.FileRequest, bool) {
	fr, err := args(w, r)
	if err != nil {
		writeError(w, r, s.log, err)
		return nil, guestapi.FileRequest{}, false
	}
	gc, err := s.guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return nil, guestapi.FileRequest{}, false
	}
	return gc, fr, true
}

// fileInfoOp is a file op that has no stream and answers with a file's
// description: (*guestapi.Client).Stat, Mkdir, Move.
type fileInfoOp func(gc *guestapi.Client, ctx context.Context, fr guestapi.FileRequest) (*api.FileInfo, error)

// fileDo makes a file op that has no stream. On error it has answered.
func (s *Server) fileDo(w http.ResponseWriter, r *http.Request, op fileInfoOp, args fileArgs) (*api.FileInfo, bool) {
	gc, fr, ok := s.fileGuest(w, r, args)
	if !ok {
		return nil, false
	}
	fi, err := op(gc, r.Context(), fr)
	if err != nil {
		writeError(w, r, s.log, err)
		return nil, false
	}
	return fi, true
}

// fileReadOp is a file op whose answer is a data stream.
type fileReadOp func(gc *guestapi.Client, ctx context.Context, fr guestapi.FileRequest) (*guestapi.FileResponse, *guestapi.DataStream, error)

// tarGet is (*guestapi.Client).TarGet as a fileReadOp.
func tarGet(gc *guestapi.Client, ctx context.Context, fr guestapi.FileRequest) (*guestapi.FileResponse, *guestapi.DataStream, error) {
	ds, err := gc.TarGet(ctx, fr)
	return nil, ds, err
}

// fileRead starts a file op whose answer is a data stream; the caller
// closes it. On error it has answered.
func (s *Server) fileRead(w http.ResponseWriter, r *http.Request, op fileReadOp, args fileArgs) (*guestapi.FileResponse, *guestapi.DataStream, bool) {
	gc, fr, ok := s.fileGuest(w, r, args)
	if !ok {
		return nil, nil, false
	}
	resp, ds, err := op(gc, r.Context(), fr)
	if err != nil {
		writeError(w, r, s.log, err)
		return nil, nil, false
	}
	return resp, ds, true
}

// fileWriteOp is a file op that streams data to the guest:
// (*guestapi.Client).WriteFile, TarPut.
type fileWriteOp func(gc *guestapi.Client, ctx context.Context, fr guestapi.FileRequest, src io.Reader) (*guestapi.FileEnd, error)

// fileWrite makes a file op that streams the request body to the guest.
// On error it has answered.
func (s *Server) fileWrite(w http.ResponseWriter, r *http.Request, op fileWriteOp, args fileArgs) (*guestapi.FileEnd, bool) {
	gc, fr, ok := s.fileGuest(w, r, args)
	if !ok {
		return nil, false
	}
	end, err := op(gc, r.Context(), fr, r.Body)
	if err != nil {
		writeError(w, r, s.log, bodyError(err))
		return nil, false
	}
	return end, true
}

// bodyError names the request body when it is what failed.
func bodyError(err error) error {
	var se *guestapi.SourceError
	if errors.As(err, &se) {
		return errdefs.Invalid("body", "reading the request body: %v", se.Err)
	}
	return err
}

// sendData answers 200, with the headers set so far, and the data as the
// body (none to a HEAD).
func (s *Server) sendData(w http.ResponseWriter, r *http.Request, ds *guestapi.DataStream) {
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := ds.WriteTo(w); err != nil {
		s.abortStream(r, err)
	}
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
	resp, ds, ok := s.fileRead(w, r, (*guestapi.Client).ReadFile, readArgs)
	if !ok {
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
	s.sendData(w, r, ds)
}

// writeFile writes the request body to a file atomically.
func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	if end, ok := s.fileWrite(w, r, (*guestapi.Client).WriteFile, writeArgs); ok {
		writeJSON(w, http.StatusOK, end.Info)
	}
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	if fi, ok := s.fileDo(w, r, (*guestapi.Client).Stat, pathArgs); ok {
		writeJSON(w, http.StatusOK, fi)
	}
}

// listFiles answers a JSON array of entries, written as the guest walks.
func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	gc, fr, ok := s.fileGuest(w, r, listArgs)
	if !ok {
		return
	}
	ls, err := gc.ListDir(r.Context(), fr)
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

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	if fi, ok := s.fileDo(w, r, (*guestapi.Client).Mkdir, mkdirArgs); ok {
		writeJSON(w, http.StatusOK, fi)
	}
}

// remove is (*guestapi.Client).Remove as a fileInfoOp.
func remove(gc *guestapi.Client, ctx context.Context, fr guestapi.FileRequest) (*api.FileInfo, error) {
	return nil, gc.Remove(ctx, fr)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.fileDo(w, r, remove, removeArgs); ok {
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) moveFile(w http.ResponseWriter, r *http.Request) {
	if fi, ok := s.fileDo(w, r, (*guestapi.Client).Move, moveArgs); ok {
		writeJSON(w, http.StatusOK, fi)
	}
}

// downloadTar streams a file or directory tree as a tar.
func (s *Server) downloadTar(w http.ResponseWriter, r *http.Request) {
	_, ds, ok := s.fileRead(w, r, tarGet, pathArgs)
	if !ok {
		return
	}
	defer ds.Close()
	w.Header().Set("Content-Type", tarType)
	s.sendData(w, r, ds)
}

// uploadTar extracts the request body, a tar, into a directory (made,
// with its parents, if missing).
func (s *Server) uploadTar(w http.ResponseWriter, r *http.Request) {
	if end, ok := s.fileWrite(w, r, (*guestapi.Client).TarPut, tarPutArgs); ok {
		writeJSON(w, http.StatusOK, api.TarResult{Entries: end.Entries, Bytes: end.Bytes})
	}
}

// watchFiles streams a directory's changes as newline-delimited JSON, one
// event per line, until the client goes away. The answer's headers are
// sent once the watch is in place.
func (s *Server) watchFiles(w http.ResponseWriter, r *http.Request) {
	gc, fr, ok := s.fileGuest(w, r, watchArgs)
	if !ok {
		return
	}
	done, err := s.done(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	es, err := gc.Watch(r.Context(), fr)
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
			end := api.WatchEnd{Type: api.WatchEndType}
			var we *guestapi.WatchEnded
			switch {
			case errors.As(err, &we):
				end.Reason = we.Reason
			case errors.Is(err, guestapi.ErrStreamCut) && sandboxEnding(done):
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
