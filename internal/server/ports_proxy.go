package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// upstreamSuffix marks the host names the proxy's transport dials: each is
// "{id}.{upstreamSuffix}:{port}". The transport pools connections by host,
// so a sandbox's pooled connection is never handed to another sandbox's
// request; the names are never resolved (".invalid" is reserved).
const upstreamSuffix = "sandbox.paddock.invalid"

func upstreamHost(id string, port int) string {
	return net.JoinHostPort(id+"."+upstreamSuffix, strconv.Itoa(port))
}

func parseUpstream(addr string) (id string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	id, ok := strings.CutSuffix(host, "."+upstreamSuffix)
	if !ok || id == "" {
		return "", 0, fmt.Errorf("proxy asked to dial %q, which is no sandbox port", addr)
	}
	port, err = parsePort(p)
	return id, port, err
}

// newPortProxy returns the reverse proxy of /v1/sandboxes/{id}/ports/{port}/
// {path...}. The route's handler has validated the id and the port.
func newPortProxy(dial portDialFunc, log *slog.Logger) *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			id, port, err := parseUpstream(addr)
			if err != nil {
				return nil, err
			}
			return dial(ctx, id, port)
		},
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		// Bodies pass as the app sent them; the transport must not ask
		// for gzip on the client's behalf and unpack it.
		DisableCompression: true,
	}
	return &httputil.ReverseProxy{
		Rewrite:        rewritePortRequest,
		Transport:      tr,
		ModifyResponse: rewritePortResponse,
		ErrorHandler:   portProxyError(log),
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

// rewritePortRequest aims a request at the app: its path is what follows
// /ports/{port} (escapes kept), its query is kept, and Host is
// localhost:PORT, which dev servers that check Host accept. The daemon's
// bearer token is the key to every sandbox and never reaches one.
func rewritePortRequest(pr *httputil.ProxyRequest) {
	id := pr.In.PathValue("id")
	port, _ := parsePort(pr.In.PathValue("port"))
	_, rest, ok := splitPortPath(pr.In.URL.EscapedPath())
	if !ok {
		rest = "/"
	}
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = upstreamHost(id, port)
	out.URL.RawPath = rest
	out.URL.Path, _ = url.PathUnescape(rest)
	out.Host = "localhost:" + strconv.Itoa(port)
	pr.SetXForwarded()
	if prefix := requestPrefix(pr.In, id, port); prefix != "" {
		out.Header.Set("X-Forwarded-Prefix", prefix)
	}
	out.Header.Del("Authorization")
}

// requestPrefix is where r's app is served: under its port's path, a
// preview's path, or "" at the root of a preview's host name.
func requestPrefix(r *http.Request, id string, port int) string {
	if p, ok := r.Context().Value(previewKey{}).(string); ok {
		return p // previews.go
	}
	return portPrefix(id, port)
}

// rewritePortResponse keeps the app's redirects under the prefix: a
// Location of "/login" (or http://localhost:PORT/login) becomes
// /v1/sandboxes/{id}/ports/{port}/login (or /login on a preview's host).
func rewritePortResponse(resp *http.Response) error {
	loc := resp.Header.Get("Location")
	if loc == "" || resp.Request == nil {
		return nil
	}
	_, port, err := net.SplitHostPort(resp.Request.Host)
	if err != nil {
		return nil
	}
	prefix, ok := resp.Request.Context().Value(previewKey{}).(string)
	if !ok {
		prefix = resp.Request.Header.Get("X-Forwarded-Prefix")
		if prefix == "" {
			return nil
		}
	}
	resp.Header.Set("Location", rewriteLocation(loc, prefix, port))
	return nil
}

func rewriteLocation(loc, prefix, port string) string {
	u, err := url.Parse(loc)
	if err != nil {
		return loc
	}
	switch {
	case u.Scheme == "" && u.Host == "" && strings.HasPrefix(loc, "/") && !strings.HasPrefix(loc, "//"):
		if loc == prefix || strings.HasPrefix(loc, prefix+"/") || strings.HasPrefix(loc, prefix+"?") {
			return loc // the app honours X-Forwarded-Prefix
		}
		return prefix + loc
	case (u.Scheme == "http" || u.Scheme == "https") && isAppHost(u, port):
		out := prefix + u.EscapedPath()
		if u.Path == "" {
			out += "/"
		}
		if u.RawQuery != "" || u.ForceQuery {
			out += "?" + u.RawQuery
		}
		if u.Fragment != "" {
			out += "#" + u.EscapedFragment()
		}
		return out
	}
	return loc
}

// isAppHost reports whether u points at the app itself: the sandbox's
// loopback at the proxied port.
func isAppHost(u *url.URL, port string) bool {
	switch u.Hostname() {
	case "localhost", "127.0.0.1", "::1":
	default:
		return false
	}
	p := u.Port()
	if p == "" {
		p = "80"
		if u.Scheme == "https" {
			p = "443"
		}
	}
	return p == port
}

// portProxyError answers a failed proxied request. Failures of the app
// (nothing listens, no valid HTTP answer) are a 502 whose message is about
// the user's own program; failures of the sandbox (gone, stopped) take
// the API's usual statuses.
func portProxyError(log *slog.Logger) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		if r.Context().Err() != nil {
			return // the client went away
		}
		id, port := r.PathValue("id"), r.PathValue("port")
		var de *portDialError
		switch {
		case errors.As(err, &de) && errors.Is(err, errdefs.ErrNotFound):
			writeGatewayError(w, de.Error())
		case errors.As(err, &de):
			log.Debug("proxy could not connect", "sandbox", id, "port", port, "err", err)
			writeGatewayError(w, fmt.Sprintf("could not connect to port %s in sandbox %s", port, id))
		case errdefs.Code(err) != "internal":
			writeError(w, r, log, err)
		default:
			log.Debug("proxied request failed", "sandbox", id, "port", port, "method", r.Method, "path", r.URL.Path, "err", err)
			writeGatewayError(w, fmt.Sprintf("the service on port %s in sandbox %s gave no valid HTTP answer", port, id))
		}
	}
}

// writeGatewayError answers 502 {"code": "unavailable", ...}. It does not
// go through writeError, which hides the message of every 5xx but 503 and
// logs it as a daemon fault: here the fault is the user's program, and
// the message, which names only the sandbox and the port, is what the
// user needs to see.
func writeGatewayError(w http.ResponseWriter, msg string) {
	writeJSON(w, http.StatusBadGateway, api.Error{Code: errdefs.Code(errdefs.ErrUnavailable), Message: msg})
}

// proxyPort serves /v1/sandboxes/{id}/ports/{port}/{path...} through the
// proxy, once the sandbox is known to run.
func (s *Server) proxyPort(proxy *httputil.ReverseProxy) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := parsePort(r.PathValue("port")); err != nil {
			writeError(w, r, s.log, err)
			return
		}
		if _, err := s.guest(r.Context(), r.PathValue("id")); err != nil {
			writeError(w, r, s.log, err)
			return
		}
		proxy.ServeHTTP(w, r)
	}
}
