package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/internal/connlimit"
	"github.com/paddock-dev/paddock/internal/reqcheck"
)

// E2B's port ingress: a client reaches port P of sandbox ID at
// https://P-ID.DOMAIN (the SDK's getHost). With a domain configured, the
// facade's listener routes by the Host header: port 49983 is the
// sandbox's envd surface (so plain clients of signed URLs reach it too),
// any other port is proxied to the sandbox's port through the guest, as
// the native /v1/sandboxes/{id}/ports/{port}/ proxy does; WebSockets
// included.

// EnvdPort is the port envd listens on in E2B's sandboxes.
const EnvdPort = 49983

// TrafficTokenHeader carries the traffic access token to the ingress of
// a sandbox created with allowPublicTraffic false.
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// hostTarget parses a Host of the form PORT-ID.DOMAIN; ok is false for
// any other host (the control plane's own name, for one).
func (s *Server) hostTarget(host string) (port int, id string, ok bool) {
	return HostTarget(host, s.domain)
}

// HostTarget parses a Host of the form PORT-ID.DOMAIN (domain lowercase,
// without dots at either end); ok is false for any other host, and for
// every host when domain is empty. A cluster's gateway routes such hosts
// by the id's node tag.
func HostTarget(host, domain string) (port int, id string, ok bool) {
	if domain == "" {
		return 0, "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+domain)
	if !ok {
		return 0, "", false
	}
	p, id, ok := strings.Cut(label, "-")
	if !ok || reqcheck.SandboxID("host", id) != nil {
		return 0, "", false
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != p {
		return 0, "", false
	}
	return port, id, true
}

// ingressError is E2B's edge's JSON body for a port it cannot reach.
type ingressError struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Port      string `json:"port,omitempty"`
	Code      int    `json:"code,omitempty"`
}

type ingressKey struct{}

type ingressTarget struct {
	id   string
	port int
}

// serveIngress proxies r to port of sandbox id.
func (s *Server) serveIngress(w http.ResponseWriter, r *http.Request, id string, port int) {
	if ok, _ := s.running(r.Context(), id); !ok {
		if _, err := s.mgr.Get(r.Context(), id); err != nil {
			setMoved(w, err) // for a gateway to follow
		}
		IngressNotRunning(w, r, id, port)
		return
	}
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		IngressNotRunning(w, r, id, port)
		return
	}
	if sb.Labels[labelPrivate] != "" {
		got := r.Header.Get(TrafficTokenHeader)
		switch {
		case got == "":
			ingressFail(w, r, http.StatusForbidden, "Traffic Access Token Missing", ingressError{SandboxID: id, Code: http.StatusForbidden,
				Message: "Sandbox is secured with traffic access token. Token header '" + strings.ToLower(TrafficTokenHeader) + "' is missing"})
			return
		case subtle.ConstantTimeCompare([]byte(got), []byte(s.trafficToken(id))) != 1:
			ingressFail(w, r, http.StatusForbidden, "Traffic Access Token Invalid", ingressError{SandboxID: id, Code: http.StatusForbidden,
				Message: "Sandbox is secured with traffic access token. Provided token in header '" + strings.ToLower(TrafficTokenHeader) + "' is invalid"})
			return
		}
	}
	// A public port is open to anyone who names a running sandbox (a
	// private one, to holders of its token): the connection counts as
	// authenticated from here, kept open after its answer and free of
	// the read deadline (a WebSocket lives long).
	connlimit.Authenticated(w, r)
	host := "localhost:" + strconv.Itoa(port)
	if m := sb.Labels[labelMaskHost]; m != "" {
		host = strings.ReplaceAll(m, "${PORT}", strconv.Itoa(port))
	}
	s.mgr.Touch(id)
	ctx := context.WithValue(r.Context(), ingressKey{}, ingressTarget{id: id, port: port})
	r = r.WithContext(ctx)
	r.Host = host
	s.ingress.ServeHTTP(w, r)
}

// newIngressProxy is the reverse proxy of the port ingress: it dials the
// sandbox's port through its guest.
func (s *Server) newIngressProxy() *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			t, ok := ctx.Value(ingressKey{}).(ingressTarget)
			if !ok || addr != upstreamAddr(t) {
				return nil, errors.New("ingress dial without its target")
			}
			gc, err := s.mgr.RunningGuest(ctx, t.id)
			if err != nil {
				return nil, err
			}
			return gc.DialPort(ctx, t.port)
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(ingressKey{}).(ingressTarget)
			pr.Out.URL.Scheme = "http"
			// One pool per sandbox and port: a connection is never handed
			// to another sandbox's request. The name is never resolved.
			pr.Out.URL.Host = upstreamAddr(t)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			pr.Out.Header.Del(TrafficTokenHeader)
		},
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			t := r.Context().Value(ingressKey{}).(ingressTarget)
			s.log.Debug("ingress failed", "sandbox", t.id, "port", t.port, "err", err)
			ingressFail(w, r, http.StatusBadGateway, "Closed Port Error", ingressError{SandboxID: t.id, Message: "The sandbox is running but port is not open", Port: strconv.Itoa(t.port)})
		},
	}
}

func upstreamAddr(t ingressTarget) string {
	return t.id + ".sandbox.paddock.invalid:" + strconv.Itoa(t.port)
}
