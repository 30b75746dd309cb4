package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/netpipe"
)

// PortProtocol is the Upgrade token of a raw connection to a sandbox port.
const PortProtocol = "tcp"

// portDialTimeout bounds opening a pipe to a sandbox port: the guest's
// connect, and the control connection before it.
const portDialTimeout = 10 * time.Second

// proxiedMethods are the methods the HTTP proxy passes on. HEAD is served
// by the GET route; CONNECT and TRACE are not proxied.
var proxiedMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// portRoutes are the /v1/sandboxes/{id}/ports endpoints. They reach a TCP
// port that listens inside a sandbox without opening the sandbox's
// egress. Every way in goes through the guest's port.connect
// op, a byte pipe to 127.0.0.1:PORT (or [::1]:PORT) dialled by the guest
// in the sandbox's own network namespace: the daemon never dials a
// sandbox port on the host, so the host's loopback and other sandboxes
// are out of reach whatever the request says.
//
//   - Host forwards (POST/GET /v1/sandboxes/{id}/ports, DELETE
//     .../ports/{port}): a listener on the host's 127.0.0.1 at a free
//     port, one per port the user asked for; each accepted connection is
//     piped to the port in the sandbox (portTable, ports_forward.go).
//   - The HTTP proxy (any common method on
//     /v1/sandboxes/{id}/ports/{port}/{path...}): httputil.ReverseProxy,
//     WebSocket upgrades included, behind the API's authentication
//     (ports_proxy.go).
//   - Raw connections (POST /v1/sandboxes/{id}/ports/{port} with
//     "Connection: Upgrade" and "Upgrade: tcp"): after a 101 the API
//     connection is the TCP connection; the Go SDK's DialPort.
func (s *Server) portRoutes() []route {
	log := s.log.With("component", "ports")
	table := newPortTable(s.dialPort, s.mgr.Done, log)
	proxy := newPortProxy(s.dialPort, log)
	s.portProxy = proxy
	routes := []route{
		{"GET /v1/sandboxes/{id}/ports", s.listPorts(table)},
		{"POST /v1/sandboxes/{id}/ports", s.openPort(table)},
		{"DELETE /v1/sandboxes/{id}/ports/{port}", s.closePort(table)},
		{"POST /v1/sandboxes/{id}/ports/{port}", s.connectPort},
		{"GET /v1/sandboxes/{id}/ports/{port}", s.portRoot},
	}
	for _, m := range proxiedMethods {
		routes = append(routes, route{m + " /v1/sandboxes/{id}/ports/{port}/{path...}", s.proxyPort(proxy)})
	}
	return routes
}

// portDialError is a failure to reach a port in a sandbox whose guest
// answered (or should have): nothing listens, or the guest is going away.
type portDialError struct {
	ID   string
	Port int
	Err  error
}

func (e *portDialError) Error() string {
	if errors.Is(e.Err, errdefs.ErrNotFound) {
		return fmt.Sprintf("nothing listens on port %d in sandbox %s", e.Port, e.ID)
	}
	return fmt.Sprintf("connecting to port %d in sandbox %s: %v", e.Port, e.ID, e.Err)
}

func (e *portDialError) Unwrap() error { return e.Err }

// dialPort opens a byte pipe to a port in a running sandbox.
func (s *Server) dialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	gc, err := s.guest(ctx, id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, portDialTimeout)
	defer cancel()
	conn, err := gc.DialPort(ctx, port)
	if err != nil {
		return nil, &portDialError{ID: id, Port: port, Err: err}
	}
	return conn, nil
}

// parsePort reads a port from a path: decimal, 1-65535, no sign and no
// leading zero, so that each port has one URL.
func parsePort(s string) (int, error) {
	bad := func() (int, error) {
		if len(s) > 32 {
			s = s[:32] + "..."
		}
		return 0, errdefs.Invalid("port", "%q is not a port number (1-65535)", s)
	}
	if s == "" || len(s) > 5 || s[0] == '0' {
		return bad()
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return bad()
		}
	}
	n, _ := strconv.Atoi(s)
	if guestapi.ValidPort(n) != nil {
		return bad()
	}
	return n, nil
}

// splitPortPath splits an escaped proxied path,
// /v1/sandboxes/{id}/ports/{port}/{rest...}, into its prefix (up to the
// port, no trailing slash) and the app's path (from the slash after the
// port, escapes kept). ok is false for any other path, including the
// port's own /v1/sandboxes/{id}/ports/{port}.
func splitPortPath(escaped string) (prefix, rest string, ok bool) {
	const head = "/v1/sandboxes/"
	if !strings.HasPrefix(escaped, head) {
		return "", "", false
	}
	tail := escaped[len(head):]
	i := strings.IndexByte(tail, '/')
	if i <= 0 || !strings.HasPrefix(tail[i:], "/ports/") {
		return "", "", false
	}
	after := tail[i+len("/ports/"):]
	j := strings.IndexByte(after, '/')
	if j <= 0 {
		return "", "", false
	}
	cut := len(head) + i + len("/ports/") + j
	return escaped[:cut], escaped[cut:], true
}

// portPrefix is the canonical path of a port: where its proxy lives.
func portPrefix(id string, port int) string {
	return "/v1/sandboxes/" + id + "/ports/" + strconv.Itoa(port)
}

// upgradeTo reports whether the request asks to switch to proto.
func upgradeTo(r *http.Request, proto string) bool {
	if !strings.EqualFold(strings.TrimSpace(r.Header.Get("Upgrade")), proto) {
		return false
	}
	for _, v := range strings.Split(r.Header.Get("Connection"), ",") {
		if strings.EqualFold(strings.TrimSpace(v), "upgrade") {
			return true
		}
	}
	return false
}

func (s *Server) listPorts(t *portTable) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if _, err := s.mgr.Get(r.Context(), id); err != nil {
			writeError(w, r, s.log, err)
			return
		}
		writeJSON(w, http.StatusOK, t.list(id))
	}
}

// openPort opens a host forward, or answers the one already open for the
// port (200 instead of 201).
func (s *Server) openPort(t *portTable) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req api.PortRequest
		if err := decode(w, r, &req); err != nil {
			writeError(w, r, s.log, err)
			return
		}
		if req.Port == nil {
			writeError(w, r, s.log, errdefs.Invalid("port", "required: the port in the sandbox to forward"))
			return
		}
		if err := guestapi.ValidPort(*req.Port); err != nil {
			writeError(w, r, s.log, err)
			return
		}
		f, created, err := t.open(r.Context(), r.PathValue("id"), *req.Port)
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		code := http.StatusOK
		if created {
			code = http.StatusCreated
		}
		writeJSON(w, code, f)
	}
}

func (s *Server) closePort(t *portTable) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		port, err := parsePort(r.PathValue("port"))
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		if _, err := s.mgr.Get(r.Context(), id); err != nil {
			writeError(w, r, s.log, err)
			return
		}
		if err := t.close(id, port); err != nil {
			writeError(w, r, s.log, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// portRoot sends a browser that left out the trailing slash to the app's
// root, so that the app's relative links resolve under the prefix.
func (s *Server) portRoot(w http.ResponseWriter, r *http.Request) {
	port, err := parsePort(r.PathValue("port"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	loc := portPrefix(r.PathValue("id"), port) + "/"
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	http.Redirect(w, r, loc, http.StatusTemporaryRedirect)
}

// connectPort turns the API connection into a TCP connection to the port
// in the sandbox: 101, then raw bytes both ways, half-closes included,
// until either side closes.
func (s *Server) connectPort(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	port, err := parsePort(r.PathValue("port"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if !upgradeTo(r, PortProtocol) {
		w.Header().Set("Upgrade", PortProtocol)
		writeError(w, r, s.log, &HTTPError{Code: http.StatusUpgradeRequired,
			Msg: "connecting to a port needs the headers Connection: Upgrade and Upgrade: " + PortProtocol, Err: errdefs.ErrInvalid})
		return
	}
	up, err := s.dialPort(r.Context(), id, port)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	hj, bufrw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		s.log.Warn("hijacking a port connection", "err", err)
		return
	}
	hj.SetDeadline(time.Time{})
	bufrw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + PortProtocol + "\r\n\r\n")
	if err := bufrw.Flush(); err != nil {
		hj.Close()
		up.Close()
		return
	}
	netpipe.Splice(netpipe.WithBuffered(hj, bufrw.Reader), up)
}
