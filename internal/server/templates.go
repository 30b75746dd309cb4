package server

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/template"
)

// ndjsonContentType is the media type of a template build's log.
const ndjsonContentType = "application/x-ndjson"

// templateRoutes serve templates and the warm pools.
func (s *Server) templateRoutes() []route {
	return []route{
		{"POST /v1/templates", s.buildTemplate},
		{"GET /v1/templates", s.listTemplates},
		{"GET /v1/templates/{name}", s.getTemplate},
		{"DELETE /v1/templates/{name}", s.removeTemplate},
		{"GET /v1/pools", s.pools},
		{"PUT /v1/pools", s.setPool},
	}
}

// buildTemplate takes a spec as JSON (copy steps with inline content), or
// a tar build context holding the spec (?file=, default paddock.yaml)
// beside the files its copy steps name; ?name= overrides the spec's name.
// Errors found before the build starts answer with their status; after
// that the answer is the build's log, one JSON event per line, ending with
// the template or an error.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	spec, files, err := readTemplateRequest(w, r)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if name := r.URL.Query().Get("name"); name != "" {
		spec.Name = name
	}
	started := false
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	emit := func(e api.TemplateEvent) {
		if !started {
			started = true
			w.Header().Set("Content-Type", ndjsonContentType)
			w.WriteHeader(http.StatusOK)
		}
		enc.Encode(e)
		rc.Flush()
	}
	t, err := s.mgr.Templates().Build(r.Context(), spec, files, emit)
	switch {
	case err != nil && !started:
		writeError(w, r, s.log, err)
	case err != nil:
		body := api.Error{Code: errdefs.Code(err), Message: err.Error()}
		if body.Code == "internal" {
			s.log.Error("template build failed", "template", spec.Name, "err", err)
			body.Message = "internal error; see the daemon log"
		}
		emit(api.TemplateEvent{Error: &body})
	default:
		emit(api.TemplateEvent{Template: &t})
	}
}

func readTemplateRequest(w http.ResponseWriter, r *http.Request) (api.TemplateSpec, *template.Context, error) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "", "application/json":
		var spec api.TemplateSpec
		if err := decode(w, r, &spec); err != nil {
			return spec, nil, err
		}
		return spec, nil, nil
	case "application/x-tar":
		file := r.URL.Query().Get("file")
		if file == "" {
			file = "paddock.yaml"
		}
		body := &countingReader{r: io.LimitReader(r.Body, maxContextBody+1)}
		files, raw, err := template.ReadContext(body, file)
		if body.n > maxContextBody {
			return api.TemplateSpec{}, nil, fmt.Errorf("%w: the build context exceeds %d bytes", errdefs.ErrTooLarge, maxContextBody)
		}
		if err != nil {
			return api.TemplateSpec{}, nil, err
		}
		if raw == nil {
			return api.TemplateSpec{}, nil, errdefs.Invalid("file", "the build context has no %q", file)
		}
		spec, err := template.Parse(raw)
		return spec, files, err
	}
	return api.TemplateSpec{}, nil, &HTTPError{Code: http.StatusUnsupportedMediaType, Msg: "a template build takes application/json or application/x-tar", Err: errdefs.ErrInvalid}
}

// maxContextBody bounds a tar build context: its files plus tar headers.
const maxContextBody = template.MaxContext + 8<<20

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	list, err := s.mgr.Templates().List(r.Context())
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.mgr.Templates().Get(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

func (s *Server) removeTemplate(w http.ResponseWriter, r *http.Request) {
	if err := s.mgr.Templates().Remove(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pools(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.mgr.Pools().List(r.Context()))
}

// setPool sizes the warm pool of an image ("image:NAME") or a template
// ("template:NAME"); size 0 removes it.
func (s *Server) setPool(w http.ResponseWriter, r *http.Request) {
	var req api.PoolRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	p, err := s.mgr.Pools().Set(r.Context(), req.Name, req.Size)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}
