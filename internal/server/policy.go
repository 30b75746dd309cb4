package server

import (
	"net/http"
	"sort"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Secrets is the daemon's secret store as the API sees it: values go in,
// only names come out.
type Secrets interface {
	Create(name string, value []byte) error
	List() []string
	Delete(name string) error
}

// SetSecrets sets the secret store; without one the secret routes answer
// 503.
func (s *Server) SetSecrets(sec Secrets) { s.secrets = sec }

// maxSecret caps a secret's value.
const maxSecret = 64 << 10

func (s *Server) policyRoutes() []route {
	return []route{
		{"GET /v1/sandboxes/{id}/policy", s.getPolicy},
		{"PUT /v1/sandboxes/{id}/policy", s.putPolicy},
		{"POST /v1/secrets", s.createSecret},
		{"GET /v1/secrets", s.listSecrets},
		{"DELETE /v1/secrets/{name}", s.deleteSecret},
	}
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request) {
	p, err := s.mgr.Policy(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request) {
	var p api.Policy
	if err := decode(w, r, &p); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	out, err := s.mgr.SetPolicy(r.Context(), r.PathValue("id"), p)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

var errNoSecrets = errdefs.New(errdefs.ErrUnavailable, "this daemon has no secret store")

func (s *Server) createSecret(w http.ResponseWriter, r *http.Request) {
	if s.secrets == nil {
		writeError(w, r, s.log, errNoSecrets)
		return
	}
	var req api.SecretRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	switch {
	case req.Value == "":
		writeError(w, r, s.log, errdefs.Invalid("value", "is empty"))
		return
	case len(req.Value) > maxSecret:
		writeError(w, r, s.log, errdefs.Invalid("value", "longer than %d bytes", maxSecret))
		return
	}
	if err := s.secrets.Create(req.Name, []byte(req.Value)); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, api.Secret{Name: req.Name})
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	if s.secrets == nil {
		writeError(w, r, s.log, errNoSecrets)
		return
	}
	names := s.secrets.List()
	sort.Strings(names)
	out := make([]api.Secret, 0, len(names))
	for _, n := range names {
		out = append(out, api.Secret{Name: n})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	if s.secrets == nil {
		writeError(w, r, s.log, errNoSecrets)
		return
	}
	if err := s.secrets.Delete(r.PathValue("name")); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
