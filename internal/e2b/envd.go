package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/connlimit"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
)

// envdRoutes is each sandbox's envd surface; the sandbox is named by the
// E2b-Sandbox-Id header.
func (s *Server) envdRoutes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.Handle("GET /files", s.sandboxCall(true, s.download))
	mux.Handle("POST /files", s.sandboxCall(true, s.upload))
	for name, h := range map[string]http.HandlerFunc{
		"process.Process/Start":          s.processStart,
		"process.Process/Connect":        s.processConnect,
		"process.Process/List":           unary(s, s.processList),
		"process.Process/SendInput":      unary(s, s.processInput),
		"process.Process/CloseStdin":     unary(s, s.processCloseStdin),
		"process.Process/SendSignal":     unary(s, s.processSignal),
		"process.Process/Update":         unary(s, s.processUpdate),
		"filesystem.Filesystem/Stat":     unary(s, s.fsStat),
		"filesystem.Filesystem/ListDir":  unary(s, s.fsListDir),
		"filesystem.Filesystem/MakeDir":  unary(s, s.fsMakeDir),
		"filesystem.Filesystem/Move":     unary(s, s.fsMove),
		"filesystem.Filesystem/Remove":   unary(s, s.fsRemove),
		"filesystem.Filesystem/WatchDir": s.fsWatchDir,
	} {
		mux.Handle("POST /"+name, s.sandboxCall(false, h))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/process.") || strings.HasPrefix(r.URL.Path, "/filesystem.") {
			s.writeUnaryError(w, r, &rpcError{Code: "unimplemented", Message: r.URL.Path + " is not implemented"})
			return
		}
		writeAPIError(w, http.StatusNotFound, "no such envd endpoint: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

func sandboxID(r *http.Request) string { return r.Header.Get("E2b-Sandbox-Id") }

// unreachable answers as E2B's edge does for a sandbox that is not
// running (killed, paused, never there): 502.
func unreachable(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{
		"code": http.StatusBadGateway, "message": "the sandbox is not running", "sandboxId": id,
	})
}

// gone answers a call, from a holder of its token, for sandbox id that
// does not run here: E2B's 502, which names in errdefs.MovedHeader the
// node it moved to when another node took it in from the archive, for a
// cluster's gateway to follow.
func (s *Server) gone(w http.ResponseWriter, r *http.Request, id string) {
	if _, err := s.mgr.Get(r.Context(), id); err != nil {
		setMoved(w, err)
	}
	unreachable(w, id)
}

// setMoved names on the answer the node a MovedError says the sandbox
// went to.
func setMoved(w http.ResponseWriter, err error) {
	if me := (*errdefs.MovedError)(nil); errors.As(err, &me) {
		w.Header().Set(errdefs.MovedHeader, me.Node)
	}
}

// running reports whether sandbox id runs; paused reports whether it is
// paused (or frozen) with auto-resume, so that a call may wake it.
func (s *Server) running(ctx context.Context, id string) (running, paused bool) {
	if reqcheck.SandboxID("id", id) != nil {
		return false, false
	}
	sb, err := s.mgr.Get(ctx, id)
	if err != nil {
		return false, false
	}
	switch sb.State {
	case api.StateRunning:
		// A removal in progress answered Get with the state it had
		// before; Done sees the sandbox gone.
		done, err := s.mgr.Done(ctx, id)
		if err != nil {
			return false, false
		}
		select {
		case <-done:
			return false, false
		default:
			return true, false
		}
	case api.StatePaused, api.StateFrozen:
		return false, sb.AutoResume
	}
	return false, false
}

// health is envd's liveness probe: 204 while the sandbox runs, 502 once
// it is killed or paused (the SDKs read a dropped stream followed by a
// 502 as "the sandbox ended"). It never resumes a sandbox. A caller
// without the sandbox's access token (the SDKs send it here too) gets
// the 502 of an unknown id, so that the probe does not tell who holds no
// key which ids exist.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	id := sandboxID(r)
	if !s.holdsToken(r, id) {
		unreachable(w, id)
		return
	}
	if ok, _ := s.running(r.Context(), id); !ok {
		s.gone(w, r, id)
		return
	}
	vouch(w, r)
	w.WriteHeader(http.StatusNoContent)
}

// VouchedHeader is set on an envd answer to a caller that held the
// sandbox's access token, whatever the answer's status (a file not found
// is a 404 to an authenticated caller). A cluster gateway, which cannot
// check the token itself, keeps the client's connection as authenticated
// on it, and takes the header off.
const VouchedHeader = "Paddock-Vouched"

// vouch marks r's connection authenticated and says so to a gateway.
func vouch(w http.ResponseWriter, r *http.Request) {
	connlimit.Authenticated(w, r)
	w.Header().Set(VouchedHeader, "1")
}

// holdsToken reports whether r carries sandbox id's access token.
func (s *Server) holdsToken(r *http.Request, id string) bool {
	return subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(s.accessToken(id))) == 1
}

// sandboxCall checks that the caller holds the sandbox's access token
// (or, for /files with signed, a valid signature) and that the sandbox
// runs before h. The credentials go first: a caller without them learns
// nothing of whether the id exists.
func (s *Server) sandboxCall(signed bool, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := sandboxID(r)
		ok := s.holdsToken(r, id)
		if !ok && signed && r.URL.Query().Has("signature") {
			g, err := s.checkSignature(r, id)
			if err != nil {
				writeAPIError(w, http.StatusUnauthorized, err.Error())
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), grantKey{}, g))
			ok = true
		}
		if !ok {
			if strings.HasPrefix(r.URL.Path, "/files") {
				writeAPIError(w, http.StatusUnauthorized, "missing or wrong X-Access-Token")
			} else {
				s.writeUnaryError(w, r, &rpcError{Code: "unauthenticated", Message: "missing or wrong X-Access-Token"})
			}
			return
		}
		vouch(w, r)
		ok, wake := s.running(r.Context(), id)
		if !ok && !wake {
			s.gone(w, r, id)
			return
		}
		if wake {
			// Paused with auto-resume: the call brings it back, with
			// E2B's default lifetime from now.
			if err := s.resume(r.Context(), id, time.Duration(defaultTimeout)*time.Second); err != nil {
				s.log.Warn("auto-resuming for an envd call", "sandbox", id, "err", err)
				unreachable(w, id)
				return
			}
		}
		h(w, r)
	})
}

// resolve makes a path from an envd call absolute: relative paths are
// under the user's home. The guest resolves the result under the
// sandbox's root, so ".." cannot leave it.
func resolve(user, p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = homeOf(user) + strings.TrimPrefix(p, "~")
	}
	if !path.IsAbs(p) {
		p = path.Join(homeOf(user), p)
	}
	return path.Clean(p)
}
