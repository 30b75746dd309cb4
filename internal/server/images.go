package server

import (
	"encoding/json"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// ndjson is the media type of streamed progress: one JSON object a line.
const ndjson = "application/x-ndjson"

// imageRoutes serve images: list, import, pull, inspect and remove. An
// image is named in the query (?name=): names hold "/" and ":"
// ("127.0.0.1:5000/team/app:v1").
func (s *Server) imageRoutes() []route {
	return []route{
		{"GET /v1/images", s.listImages},
		{"DELETE /v1/images", s.removeImage},
		{"GET /v1/images/inspect", s.getImage},
		{"POST /v1/images/import", s.importImage},
		{"POST /v1/images/pull", s.pullImage},
	}
}

// imageName is the image a request names.
func imageName(r *http.Request) (string, error) {
	n := r.URL.Query().Get("name")
	if n == "" {
		return "", errdefs.Invalid("name", "required: the image's name, ID or digest")
	}
	return n, nil
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) {
	list, err := s.mgr.Images().List(r.Context())
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) {
	name, err := imageName(r)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	img, err := s.mgr.Images().Get(r.Context(), name)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, img)
}

func (s *Server) removeImage(w http.ResponseWriter, r *http.Request) {
	name, err := imageName(r)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if err := s.mgr.Images().Remove(r.Context(), name); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// importImage stores the image archive in the body (a tar stream, gzip
// allowed). The body goes to disk as it arrives, never into memory; the
// image store caps its size.
func (s *Server) importImage(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/x-tar" && mt != "application/gzip" && mt != "application/octet-stream") {
			writeError(w, r, s.log, errdefs.Invalid("Content-Type", "%q: send application/x-tar (or application/gzip)", ct))
			return
		}
	}
	img, err := s.mgr.Images().Import(r.Context(), r.Body, r.URL.Query().Get("name"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, img)
}

// pullImage pulls an image. A client that accepts application/x-ndjson
// gets progress lines while it runs and the image (or the error) in the
// last line; any other gets the image as JSON when it is done.
func (s *Server) pullImage(w http.ResponseWriter, r *http.Request) {
	var req api.PullRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if !strings.Contains(r.Header.Get("Accept"), ndjson) {
		img, err := s.mgr.Images().Pull(r.Context(), req, nil)
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		writeJSON(w, http.StatusCreated, img)
		return
	}
	w.Header().Set("Content-Type", ndjson)
	w.WriteHeader(http.StatusOK)
	ps := &pullStream{w: w, enc: json.NewEncoder(w)}
	ps.send(api.PullEvent{Status: "resolving"})
	img, err := s.mgr.Images().Pull(r.Context(), req, ps.progress)
	if err != nil {
		_, body := errorBody(r, s.log, err)
		ps.send(api.PullEvent{Error: &body})
		return
	}
	ps.send(api.PullEvent{Status: "done", Bytes: ps.bytes(), Image: &img})
}

// pullStream writes a pull's progress lines, at most a few a second.
type pullStream struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	enc  *json.Encoder
	n    int64
	last time.Time
}

func (p *pullStream) progress(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n = n
	if time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last = time.Now()
	p.sendLocked(api.PullEvent{Status: "downloading", Bytes: n})
}

func (p *pullStream) bytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *pullStream) send(e api.PullEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sendLocked(e)
}

func (p *pullStream) sendLocked(e api.PullEvent) {
	p.enc.Encode(e)
	if f, ok := p.w.(http.Flusher); ok {
		f.Flush()
	}
}
