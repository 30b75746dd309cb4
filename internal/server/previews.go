package server

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/connlimit"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/sandbox"
)

// Previews: a URL for a port of a sandbox on the daemon's listeners,
// /preview/{pid}/{path...}, served ahead of the API's authentication to
// holders of the preview's token (or to anyone, for a public one) and
// proxied as /v1/sandboxes/{id}/ports/{port}/ is: the same reverse
// proxy, WebSockets and streamed answers included.
const (
	previewPrefix = "/preview/"
	// PreviewTokenHeader carries a preview's token; the query parameter
	// previewTokenParam does too, and sets previewCookie for the
	// preview's path, for a browser that follows the printed URL.
	PreviewTokenHeader = "Paddock-Preview-Token"
	previewTokenParam  = "paddock_token"
	previewCookie      = "paddock_preview"
)

func (s *Server) previewRoutes() []route {
	return []route{
		{"POST /v1/sandboxes/{id}/previews", s.createPreview},
		{"GET /v1/sandboxes/{id}/previews", s.listPreviews},
		{"DELETE /v1/sandboxes/{id}/previews", s.revokePreviews},
		{"DELETE /v1/sandboxes/{id}/previews/{pid}", s.revokePreviews},
	}
}

// SetPreviewBase sets the URL previews are printed under: the daemon's
// TCP listener ("http://HOST:PORT"); empty prints paths only.
func (s *Server) SetPreviewBase(base string) { s.previewBase = strings.TrimSuffix(base, "/") }

func (s *Server) createPreview(w http.ResponseWriter, r *http.Request) {
	var req api.PreviewRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if s.previewBase == "" {
		writeError(w, r, s.log, errdefs.New(errdefs.ErrUnavailable, "the daemon serves no preview URLs: start it with --preview-listen tcp://HOST:PORT (their own port)"))
		return
	}
	p, err := s.mgr.CreatePreview(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if s.previewBase != "" {
		p.URL = s.previewBase + p.Path
		if p.Token != "" {
			p.URL += "?" + previewTokenParam + "=" + url.QueryEscape(p.Token)
		}
	}
	writeJSON(w, http.StatusCreated, p)
}

func (s *Server) listPreviews(w http.ResponseWriter, r *http.Request) {
	list, err := s.mgr.Previews(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	for i := range list {
		if s.previewBase != "" {
			list[i].URL = s.previewBase + list[i].Path
		}
	}
	writeJSON(w, http.StatusOK, list)
}

// revokePreviews revokes one preview ({pid}), or every preview of
// ?port=N.
func (s *Server) revokePreviews(w http.ResponseWriter, r *http.Request) {
	pid, port := r.PathValue("pid"), 0
	if pid == "" {
		var err error
		if port, err = parsePort(r.URL.Query().Get("port")); err != nil {
			writeError(w, r, s.log, errdefs.Invalid("port", "name the preview, or ?port=N for every preview of a port"))
			return
		}
	}
	n, err := s.mgr.RevokePreviews(r.Context(), r.PathValue("id"), pid, port)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"revoked": n})
}

type previewKey struct{}

// PreviewHandler serves /preview/... and nothing else, on a listener of
// its own (--preview-listen). A previewed app is the sandbox's code: on
// the API's or the console's origin its scripts could call the API with
// a browser's console session, so previews get an origin (a port) that
// serves neither.
func (s *Server) PreviewHandler() http.Handler {
	return s.recover(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, previewPrefix) {
			http.NotFound(w, r)
			return
		}
		s.servePreview(w, r)
	}))
}

func (s *Server) servePreview(w http.ResponseWriter, r *http.Request) {
	escaped := r.URL.EscapedPath()
	pid, sub, slash := strings.Cut(strings.TrimPrefix(escaped, previewPrefix), "/")
	token, fromQuery := r.Header.Get(PreviewTokenHeader), false
	q := r.URL.Query()
	if t := q.Get(previewTokenParam); t != "" && token == "" {
		token, fromQuery = t, true
	}
	if c, err := r.Cookie(previewCookie); err == nil && token == "" {
		token = c.Value
	}
	id, port, err := s.mgr.OpenPreview(pid, token)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="paddock preview"`)
		writeError(w, r, s.log, &HTTPError{Code: http.StatusUnauthorized, Msg: err.Error(), Err: err})
		return
	}
	connlimit.Authenticated(w, r) // a WebSocket or a stream may live long
	if !slash {
		// /preview/ID: the app's relative links need the slash.
		http.Redirect(w, r, sandbox.PreviewPath(pid)+queryOf(r.URL), http.StatusFound)
		return
	}
	if fromQuery {
		http.SetCookie(w, &http.Cookie{Name: previewCookie, Value: token, Path: sandbox.PreviewPath(pid),
			HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(time.Hour / time.Second)})
		q.Del(previewTokenParam)
	}
	// The token is the key to this port only, and never reaches the app.
	out := r.Clone(context.WithValue(r.Context(), previewKey{}, strings.TrimSuffix(sandbox.PreviewPath(pid), "/")))
	out.Header.Del(PreviewTokenHeader)
	out.Header.Del("Authorization")
	dropCookie(out, previewCookie)
	if fromQuery {
		out.URL.RawQuery = q.Encode()
	}
	rawPath := portPrefix(id, port) + "/" + sub
	out.URL.RawPath = rawPath
	out.URL.Path, _ = url.PathUnescape(rawPath)
	out.SetPathValue("id", id)
	out.SetPathValue("port", strconv.Itoa(port))
	s.proxyPort(s.portProxy)(w, out)
}

func queryOf(u *url.URL) string {
	if u.RawQuery == "" {
		return ""
	}
	return "?" + u.RawQuery
}

// dropCookie removes cookie name from r's Cookie headers.
func dropCookie(r *http.Request, name string) {
	cs := r.Cookies()
	r.Header.Del("Cookie")
	for _, c := range cs {
		if c.Name != name {
			r.AddCookie(c)
		}
	}
}
