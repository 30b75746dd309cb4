package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/sandbox"
	"github.com/paddock-dev/paddock/wire"
)

// controlRoutes are what a control socket serves (sandbox.ControlScope):
// exec, processes and files of the containers it controls. Everything
// else (the sandbox itself, its policy, lanes, other sandboxes, the
// daemon's other routes) is refused.
var controlRoutes = []string{
	"POST /v1/sandboxes/{id}/exec",
	"POST /v1/sandboxes/{id}/processes",
	"GET /v1/sandboxes/{id}/processes",
	"GET /v1/sandboxes/{id}/processes/{pid}",
	"GET /v1/sandboxes/{id}/processes/{pid}/stream",
	"POST /v1/sandboxes/{id}/processes/{pid}/stdin",
	"POST /v1/sandboxes/{id}/processes/{pid}/close-stdin",
	"POST /v1/sandboxes/{id}/processes/{pid}/signal",
	"POST /v1/sandboxes/{id}/processes/{pid}/resize",
	"GET /v1/sandboxes/{id}/files",
	"PUT /v1/sandboxes/{id}/files",
	"GET /v1/sandboxes/{id}/files/stat",
	"GET /v1/sandboxes/{id}/files/list",
	"POST /v1/sandboxes/{id}/files/mkdir",
	"POST /v1/sandboxes/{id}/files/remove",
	"POST /v1/sandboxes/{id}/files/move",
	"GET /v1/sandboxes/{id}/files/tar",
	"PUT /v1/sandboxes/{id}/files/tar",
	"GET /v1/sandboxes/{id}/files/watch",
}

// controlScopeKey carries a control socket's scope to its handlers.
type controlScopeKey struct{}

// controlMux is the API a control socket serves: controlRoutes, each
// behind the scope's check, and a refusal for every other path. The
// lanes answer a plain 404, which the SDK takes for "no lanes" and execs
// the HTTP way.
func (s *Server) controlMux() http.Handler {
	mux := http.NewServeMux()
	for _, r := range s.routes {
		if slices.Contains(controlRoutes, r.pattern) {
			mux.HandleFunc(r.pattern, s.inScope(r.h))
		}
	}
	for _, p := range []string{"/v1/lane", "/v1/sandboxes/{id}/lane"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "no exec lanes on a control socket", http.StatusNotFound)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		sc := r.Context().Value(controlScopeKey{}).(*sandbox.ControlScope)
		writeError(w, r, s.log, errdefs.New(errdefs.ErrDenied, "%s %s: a control socket serves only exec, processes and files of the containers it controls (%s of sandbox %s)",
			r.Method, r.URL.Path, strings.Join(sc.Controls, ", "), sc.Sandbox))
	})
	return mux
}

// inScope serves h to calls about the containers the control socket's
// scope controls, in its own sandbox, and refuses the rest.
func (s *Server) inScope(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sc := r.Context().Value(controlScopeKey{}).(*sandbox.ControlScope)
		name := containerOf(r.Context())
		if name == "" {
			name = sc.First
		}
		var err error
		switch {
		case r.PathValue("id") != sc.Sandbox:
			err = errdefs.New(errdefs.ErrDenied, "a control socket reaches only its own sandbox, %s", sc.Sandbox)
		case name == sc.Container:
			err = errdefs.New(errdefs.ErrDenied, "container %s holds this control socket and runs its own commands; name a container it controls with ?container= (%s)", name, strings.Join(sc.Controls, ", "))
		case !slices.Contains(sc.Controls, name):
			err = errdefs.New(errdefs.ErrDenied, "container %s does not control container %s (it controls %s)", sc.Container, name, strings.Join(sc.Controls, ", "))
		}
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		h(w, r)
	}
}

// ControlHandler is the API on the control socket of scope sc.
func (s *Server) ControlHandler(sc sandbox.ControlScope) http.Handler {
	s.controlOnce.Do(func() { s.control = s.controlMux() })
	cred := "control socket of " + runtime.ContainerID(sc.Sandbox, sc.Container)
	inner := s.withContainer(s.control)
	return s.recover(s.sanePath(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), controlScopeKey{}, &sc)
		inner.ServeHTTP(w, r.WithContext(context.WithValue(ctx, credentialKey{}, cred)))
	})))
}

// ControlSockets serves containers' control sockets (sandbox.Controls),
// each in a directory of its own under its dir, named by the container's
// runtime id, which the container has bound read-only at api.ControlDir.
type ControlSockets struct {
	dir string
	log *slog.Logger
	srv atomic.Pointer[Server]

	mu    sync.Mutex
	socks map[string]*http.Server // by runtime id
}

var _ sandbox.Controls = (*ControlSockets)(nil)

// NewControlSockets serves control sockets under dir. Their calls answer
// 503 until Serve gives them the API.
func NewControlSockets(dir string, log *slog.Logger) (*ControlSockets, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the control sockets' directory: %w", err)
	}
	return &ControlSockets{dir: dir, log: log, socks: map[string]*http.Server{}}, nil
}

// Serve serves s's API on the control sockets.
func (c *ControlSockets) Serve(s *Server) { c.srv.Store(s) }

// Open serves sc's socket (see sandbox.Controls).
func (c *ControlSockets) Open(sc sandbox.ControlScope) (string, error) {
	cid := runtime.ContainerID(sc.Sandbox, sc.Container)
	dir := filepath.Join(c.dir, cid)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.socks[cid]; ok {
		return dir, nil
	}
	// The directory outlives a daemon (a container has it bound); its
	// socket is made anew. Only root may write in it: the container
	// sees it read-only.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, filepath.Base(api.ControlSocket))
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return "", err
	}
	// Whoever runs in the container, root or not, may connect: the
	// socket's directory is bound into that container alone.
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return "", err
	}
	handler := sync.OnceValue(func() http.Handler { return c.srv.Load().ControlHandler(sc) })
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c.srv.Load() == nil {
				http.Error(w, "the daemon is starting", http.StatusServiceUnavailable)
				return
			}
			handler().ServeHTTP(w, r)
		}),
		ConnContext: func(ctx context.Context, conn net.Conn) context.Context {
			wire.SetSendBuffer(conn) // exec output streams through it
			return ctx
		},
		ErrorLog: slog.NewLogLogger(c.log.Handler(), slog.LevelDebug),
	}
	c.socks[cid] = hs
	go hs.Serve(l)
	return dir, nil
}

// Forget closes sandbox id's sockets and removes their directories.
func (c *ControlSockets) Forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	entries, _ := os.ReadDir(c.dir)
	for _, e := range entries {
		sb, _, ok := runtime.SplitContainerID(e.Name())
		if !ok || sb != id {
			continue
		}
		if hs := c.socks[e.Name()]; hs != nil {
			hs.Close()
			delete(c.socks, e.Name())
		}
		if err := os.RemoveAll(filepath.Join(c.dir, e.Name())); err != nil {
			c.log.Warn("removing a control socket", "container", e.Name(), "err", err)
		}
	}
}

// Prune forgets the sockets' directories of sandboxes keep says are gone
// (left by an earlier daemon).
func (c *ControlSockets) Prune(keep func(id string) bool) {
	entries, _ := os.ReadDir(c.dir)
	for _, e := range entries {
		if id, _, ok := runtime.SplitContainerID(e.Name()); ok && !keep(id) {
			c.Forget(id)
		}
	}
}

// Close closes every socket; their directories stay for the next daemon.
func (c *ControlSockets) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for cid, hs := range c.socks {
		hs.Close()
		delete(c.socks, cid)
	}
}
