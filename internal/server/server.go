// Package server owns paddock's HTTP API: routing, authentication, request
// decoding, the one error→status mapping, and the exec streams.
package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/connlimit"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/sandbox"
	"github.com/paddock-dev/paddock/internal/telemetry/hub"
)

// route is one pattern of the API, "METHOD /path".
type route struct {
	pattern string
	h       http.HandlerFunc
}

// Server serves the /v1 API.
type Server struct {
	mgr     *sandbox.Manager
	log     *slog.Logger
	version api.VersionInfo
	mux     *http.ServeMux
	routes  []route
	secrets Secrets
	tel     *hub.Hub
	// portProxy is the reverse proxy of sandboxes' ports (ports_proxy.go),
	// which previews share; previewBase is where previews are printed,
	// and previewHostBase where they are with a preview domain
	// (lowercase, no dots at the ends).
	portProxy       *httputil.ReverseProxy
	previewBase     string
	previewDomain   string
	previewHostBase *url.URL
	// control is the API of control sockets (control.go), made once.
	controlOnce sync.Once
	control     http.Handler
}

// New returns a Server for mgr.
func New(mgr *sandbox.Manager, version api.VersionInfo, log *slog.Logger) *Server {
	s := &Server{mgr: mgr, log: log, version: version, mux: http.NewServeMux()}
	routes := []route{
		{"GET /v1/version", s.getVersion},
		{"GET /v1/sandboxes", s.list},
		{"POST /v1/sandboxes", s.create},
		{"GET /v1/sandboxes/{id}", s.get},
		{"DELETE /v1/sandboxes/{id}", s.remove},
		{"POST /v1/sandboxes/{id}/stop", s.stop},
		{"POST /v1/sandboxes/{id}/pause", s.pause},
		{"POST /v1/sandboxes/{id}/archive", s.lifecycle(s.mgr.Archive)},
		{"POST /v1/sandboxes/{id}/resume", s.lifecycle(s.mgr.Resume)},
		{"POST /v1/sandboxes/{id}/freeze", s.lifecycle(s.mgr.Freeze)},
		{"POST /v1/sandboxes/{id}/thaw", s.lifecycle(func(ctx context.Context, id string) (api.Sandbox, error) { return s.mgr.Thaw(ctx, id) })},
		{"POST /v1/sandboxes/{id}/update", s.update},
		{"POST /v1/sandboxes/{id}/exec", s.exec},
		{"GET /v1/lane", s.lane},
		{"GET /v1/sandboxes/{id}/lane", s.sandboxLane},
	}
	routes = append(routes, s.processRoutes()...)
	routes = append(routes, s.fileRoutes()...)
	routes = append(routes, s.portRoutes()...)
	routes = append(routes, s.storageRoutes()...)
	routes = append(routes, s.policyRoutes()...)
	routes = append(routes, s.requestRoutes()...)
	routes = append(routes, s.previewRoutes()...)
	routes = append(routes, s.telemetryRoutes()...)
	routes = append(routes, s.imageRoutes()...)
	routes = append(routes, s.templateRoutes()...)
	s.routes = routes
	allowed := map[string][]string{}
	for _, r := range routes {
		s.mux.HandleFunc(r.pattern, r.h)
		method, path, _ := strings.Cut(r.pattern, " ")
		allowed[path] = append(allowed[path], method)
	}
	// A known path with the wrong method, and unknown paths, answer in
	// JSON like every other error.
	for path, methods := range allowed {
		allow := strings.Join(methods, ", ")
		s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, r, s.log, &HTTPError{Code: http.StatusMethodNotAllowed, Msg: fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow), Err: errdefs.ErrInvalid})
		})
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, s.log, &HTTPError{Code: http.StatusNotFound, Msg: fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path), Err: errdefs.ErrNotFound})
	})
	return s
}

// Handler returns the API handler. A non-empty token is required as a
// bearer token on every request (TCP listeners); the unix socket relies on
// its file permissions and passes "".
func (s *Server) Handler(token string) http.Handler {
	if token == "" {
		return s.TokensHandler(nil)
	}
	return s.TokensHandler(oneToken("Bearer " + token))
}

// TokensHandler is Handler for a listener that accepts any of tokens
// (a token file that rotates); nil requires none.
func (s *Server) TokensHandler(tokens Tokens) http.Handler {
	return s.recover(s.sanePath(RequireTokens(tokens, s.log, withCredential(tokens != nil, s.withContainer(s.mux)))))
}

// Tokens says which bearer tokens a listener accepts
// (*clustertls.Tokens: a token file, re-read as it changes).
type Tokens interface {
	// Accepts reports, in constant time, whether an Authorization
	// header's value presents one of them.
	Accepts(authorization string) bool
}

// oneToken accepts the one Authorization value it is.
type oneToken string

func (t oneToken) Accepts(got string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(t)) == 1
}

// RequireToken serves next only to requests that carry token as their
// bearer token (compared in constant time), and marks their connection
// authenticated (connlimit). An empty token requires nothing. The daemon's
// TCP listeners and a cluster's gateway check their clients with it.
func RequireToken(token string, log *slog.Logger, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	return RequireTokens(oneToken("Bearer "+token), log, next)
}

// RequireTokens is RequireToken for a listener that accepts any of
// tokens; nil requires nothing.
func RequireTokens(tokens Tokens, log *slog.Logger, next http.Handler) http.Handler {
	if tokens == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tokens.Accepts(r.Header.Get("Authorization")) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="paddock"`)
			writeError(w, r, log, &HTTPError{Code: http.StatusUnauthorized, Msg: "missing or wrong bearer token", Err: errdefs.ErrDenied})
			return
		}
		connlimit.Authenticated(w, r)
		next.ServeHTTP(w, r)
	})
}

// sanePath refuses paths with dot segments, empty segments or encoded
// separators, instead of letting the router clean and redirect them: an id
// never contains them, and a client that sends them is confused or hostile.
func (s *Server) sanePath(next http.Handler) http.Handler { return SanePath(s.log, next) }

// SanePath is the daemon's path check (see sanePath), for a gateway that
// routes by the path.
func SanePath(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.EscapedPath()
		// A proxied request's path beyond /v1/sandboxes/{id}/ports/{port}
		// belongs to the app in the sandbox, and may hold encoded
		// separators; only the prefix is the API's to check. (The mux
		// still cleans literal dot segments and "//" with a redirect.)
		if prefix, _, ok := splitPortPath(p); ok {
			p = prefix
		}
		lower := strings.ToLower(p)
		bad := strings.Contains(p, "//") || strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") ||
			strings.Contains(lower, "%2e") || strings.Contains(p, "\\")
		for _, seg := range strings.Split(p, "/") {
			if seg == "." || seg == ".." {
				bad = true
			}
		}
		if bad {
			writeError(w, r, log, errdefs.Invalid("path", "%q has dot segments, empty segments or encoded separators", p))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) recover(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				writeError(w, r, s.log, fmt.Errorf("panic serving %s %s: %v", r.Method, r.URL.Path, v))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// decode reads a JSON body into v, refusing oversized bodies, unknown
// fields, wrong types and trailing data with a message naming the problem.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, reqcheck.MaxBody)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return fmt.Errorf("%w: request body exceeds %d bytes", errdefs.ErrTooLarge, mbe.Limit)
		}
		return reqcheck.DecodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errdefs.Invalid("body", "unexpected data after the JSON object")
	}
	return nil
}

func (s *Server) getVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.version)
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req api.CreateRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	sb, err := s.mgr.Create(r.Context(), req)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, sb)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := sandbox.Filter{State: api.State(q.Get("state"))}
	switch f.State {
	case "", api.StateCreating, api.StateRunning, api.StateFrozen, api.StatePaused, api.StateStopped, api.StateFailed:
	default:
		writeError(w, r, s.log, errdefs.Invalid("state", "%q is not a state (creating, running, frozen, paused, stopped, failed)", f.State))
		return
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			writeError(w, r, s.log, errdefs.Invalid("label", "%q is not KEY=VALUE", l))
			return
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	writeJSON(w, http.StatusOK, s.mgr.List(r.Context(), f))
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb, err := s.mgr.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) remove(w http.ResponseWriter, r *http.Request) {
	force, err := boolParam(r, "force")
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if err := s.mgr.Remove(r.Context(), r.PathValue("id"), force); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) stop(w http.ResponseWriter, r *http.Request) {
	s.lifecycle(s.mgr.Stop)(w, r)
}

// lifecycle serves a state change that answers with the sandbox.
func (s *Server) lifecycle(change func(ctx context.Context, id string) (api.Sandbox, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sb, err := change(r.Context(), r.PathValue("id"))
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		writeJSON(w, http.StatusOK, sb)
	}
}

// pause pauses a sandbox and, with ?archive=true, archives it: a pause
// that succeeds stays when the archive fails.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	archive := r.URL.Query().Get("archive") == "true"
	s.lifecycle(func(ctx context.Context, id string) (api.Sandbox, error) {
		sb, err := s.mgr.Pause(ctx, id)
		if err != nil || !archive {
			return sb, err
		}
		if sb, err = s.mgr.Archive(ctx, id); err != nil {
			return sb, fmt.Errorf("sandbox %s is paused here, not archived: %w", id, err)
		}
		return sb, nil
	})(w, r)
}

func (s *Server) update(w http.ResponseWriter, r *http.Request) {
	var req api.UpdateRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	sb, err := s.mgr.Update(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func boolParam(r *http.Request, name string) (bool, error) {
	switch v := r.URL.Query().Get(name); v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	default:
		return false, errdefs.Invalid(name, "%q is not a boolean", v)
	}
}
