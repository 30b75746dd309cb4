package server

import (
	"context"
	"fmt"
	"net"
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

// SetPreviewDomain serves previews on host names of their own,
// PORT-PREVIEW.DOMAIN with the preview's dot a dash (wildcard DNS to the
// preview listener), at the root of their origin, where an app's absolute
// links work: base is "SCHEME://DOMAIN[:PORT]", the form they are printed
// in. The path form stays served on the listener's other names.
func (s *Server) SetPreviewDomain(base string) error {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.Path != "" && u.Path != "/" || u.User != nil || u.RawQuery != "" {
		return fmt.Errorf("preview domain %q is not DOMAIN or http(s)://DOMAIN[:PORT]", base)
	}
	domain := strings.ToLower(strings.Trim(u.Hostname(), "."))
	if net.ParseIP(domain) != nil || !strings.Contains(domain, ".") && domain != "localhost" {
		return fmt.Errorf("preview domain %q is not a domain name of which previews can be subdomains", base)
	}
	s.previewDomain, s.previewHostBase = domain, u
	return nil
}

// previewHostLabel is preview pid's host label, PORT-ID-RANDOM, or ""
// when it is longer than DNS allows (a sandbox named at length).
func previewHostLabel(pid string, port int) string {
	l := strconv.Itoa(port) + "-" + strings.Replace(pid, ".", "-", 1)
	if len(l) > 63 {
		return ""
	}
	return l
}

// previewHost parses a Host of the form PORT-ID-RANDOM.DOMAIN into the
// preview's id and port; ok is false for any other host.
func (s *Server) previewHost(host string) (pid string, port int, ok bool) {
	if s.previewDomain == "" {
		return "", 0, false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.ToLower(strings.TrimSuffix(host, ".")), "."+s.previewDomain)
	if !ok {
		return "", 0, false
	}
	p, rest, ok := strings.Cut(label, "-")
	if !ok {
		return "", 0, false
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != p {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return "", 0, false
	}
	return rest[:i] + "." + rest[i+1:], port, true
}

// previewURL is where p is printed: on its own host name when the daemon
// has a preview domain, else under the listener's path.
func (s *Server) previewURL(p api.Preview) string {
	if label := previewHostLabel(p.ID, p.Port); s.previewDomain != "" && label != "" {
		u := *s.previewHostBase
		u.Host = label + "." + s.previewDomain
		if port := s.previewHostBase.Port(); port != "" {
			u.Host = net.JoinHostPort(u.Host, port)
		}
		u.Path = "/"
		return u.String()
	}
	if s.previewBase == "" {
		return ""
	}
	return s.previewBase + p.Path
}

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
	if p.URL = s.previewURL(p); p.Token != "" {
		p.URL += "?" + previewTokenParam + "=" + url.QueryEscape(p.Token)
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
		list[i].URL = s.previewURL(list[i])
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

// PreviewHandler serves previews and nothing else, on a listener of its
// own (--preview-listen): /preview/... and, with a preview domain, every
// path of a preview's host name. A previewed app is the sandbox's code: on
// the API's or the console's origin its scripts could call the API with
// a browser's console session, so previews get an origin (a port, or a
// host name each) that serves neither.
func (s *Server) PreviewHandler() http.Handler {
	return s.recover(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if pid, port, ok := s.previewHost(r.Host); ok {
			s.serveHostPreview(w, r, pid, port)
			return
		}
		if !strings.HasPrefix(r.URL.Path, previewPrefix) {
			http.NotFound(w, r)
			return
		}
		s.servePreview(w, r)
	}))
}

// previewToken is the token a request to a preview carries: in the
// header, the query (fromQuery) or the cookie, in that order.
func previewToken(r *http.Request) (token string, fromQuery bool) {
	if t := r.Header.Get(PreviewTokenHeader); t != "" {
		return t, false
	}
	if t := r.URL.Query().Get(previewTokenParam); t != "" {
		return t, true
	}
	if c, err := r.Cookie(previewCookie); err == nil {
		return c.Value, false
	}
	return "", false
}

// openPreview checks r's token for preview pid; it has answered 401 when
// ok is false.
func (s *Server) openPreview(w http.ResponseWriter, r *http.Request, pid string) (id string, port int, token string, fromQuery, ok bool) {
	token, fromQuery = previewToken(r)
	id, port, err := s.mgr.OpenPreview(pid, token)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="paddock preview"`)
		writeError(w, r, s.log, &HTTPError{Code: http.StatusUnauthorized, Msg: err.Error(), Err: err})
		return "", 0, "", false, false
	}
	connlimit.Authenticated(w, r) // a WebSocket or a stream may live long
	return id, port, token, fromQuery, true
}

// previewRequest is r as the port proxy takes it: aimed at path of port
// of sandbox id, without the preview's token, which is the key to this
// port only and never reaches the app; prefix is where the app is served
// ("" at the root of a host name).
func previewRequest(r *http.Request, id string, port int, path, prefix string, fromQuery bool) *http.Request {
	out := r.Clone(context.WithValue(r.Context(), previewKey{}, prefix))
	out.Header.Del(PreviewTokenHeader)
	out.Header.Del("Authorization")
	dropCookie(out, previewCookie)
	if fromQuery {
		q := out.URL.Query()
		q.Del(previewTokenParam)
		out.URL.RawQuery = q.Encode()
	}
	rawPath := portPrefix(id, port) + "/" + path
	out.URL.RawPath = rawPath
	out.URL.Path, _ = url.PathUnescape(rawPath)
	out.SetPathValue("id", id)
	out.SetPathValue("port", strconv.Itoa(port))
	return out
}

// serveHostPreview serves a request to a preview's host name: the app at
// the root. A token from the query sets a cookie for this host alone
// (no Domain: a sibling preview's host never gets it).
func (s *Server) serveHostPreview(w http.ResponseWriter, r *http.Request, pid string, port int) {
	id, pport, token, fromQuery, ok := s.openPreview(w, r, pid)
	if !ok {
		return
	}
	if pport != port {
		// The host names another port than the preview's: the token opens
		// the preview's port only.
		writeError(w, r, s.log, &HTTPError{Code: http.StatusUnauthorized, Msg: "this preview is of another port", Err: errdefs.ErrDenied})
		return
	}
	if fromQuery {
		http.SetCookie(w, &http.Cookie{Name: previewCookie, Value: token, Path: "/",
			HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || s.previewHostBase.Scheme == "https", MaxAge: int(time.Hour / time.Second)})
	}
	s.proxyPort(s.portProxy)(w, previewRequest(r, id, port, strings.TrimPrefix(r.URL.EscapedPath(), "/"), "", fromQuery))
}

func (s *Server) servePreview(w http.ResponseWriter, r *http.Request) {
	escaped := r.URL.EscapedPath()
	pid, sub, slash := strings.Cut(strings.TrimPrefix(escaped, previewPrefix), "/")
	id, port, token, fromQuery, ok := s.openPreview(w, r, pid)
	if !ok {
		return
	}
	if !slash {
		// /preview/ID: the app's relative links need the slash.
		http.Redirect(w, r, sandbox.PreviewPath(pid)+queryOf(r.URL), http.StatusFound)
		return
	}
	if fromQuery {
		http.SetCookie(w, &http.Cookie{Name: previewCookie, Value: token, Path: sandbox.PreviewPath(pid),
			HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(time.Hour / time.Second)})
	}
	s.proxyPort(s.portProxy)(w, previewRequest(r, id, port, sub, strings.TrimSuffix(sandbox.PreviewPath(pid), "/"), fromQuery))
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
