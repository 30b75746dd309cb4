// Package e2b owns paddock's E2B-compatible facade: the control plane
// (/sandboxes, /v2/sandboxes) and each sandbox's envd surface (the
// process and filesystem Connect services, REST /files and /health), so
// that the unchanged E2B SDKs drive paddock's sandboxes. It is a
// translation layer over sandbox.Manager and the guest client: one sandbox
// is the same sandbox through this surface and the native API.
//
// The wire formats follow E2B's published specifications (the control
// plane's OpenAPI document, envd's .proto files and REST spec); docs/e2b.md
// lists what is served and how it maps onto paddock.
package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/connlimit"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/sandbox"
)

// EnvdVersion is the envd version the facade reports. The SDKs gate
// features on it: 0.6.4 enables everything implemented here (stdin
// choice, default user, closeStdin, octet-stream and gzip uploads, file
// metadata in user.e2b.* xattrs from 0.6.2, watch events with entry info
// from 0.6.3, watching network mounts, by polling, from 0.6.4).
const EnvdVersion = "0.6.4"

// DefaultTemplate is the template E2B SDKs ask for when none is named; it
// maps to the built-in image of the same name.
const DefaultTemplate = "base"

// DefaultUser is the user envd calls run as when none is named.
const DefaultUser = "user"

// Config configures the facade.
type Config struct {
	Manager *sandbox.Manager
	// Key is the secret envd access tokens are derived from (32 bytes or
	// more), the same across restarts: the daemon's secret store derives
	// it.
	Key []byte
	// Token is the daemon's bearer token: the one API key accepted is
	// derived from it (APIKey).
	Token string
	// Tokens, when set, lists the daemon's tokens now (a token file that
	// rotates): the API key of each is accepted, and Token's only while
	// it is one of them.
	Tokens func() []string
	// Telemetry answers getMetrics; nil answers it 503.
	Telemetry Telemetry
	// Secrets stores the values of E2B's header transforms; nil refuses
	// them.
	Secrets Secrets
	// DefaultEgress is whether a sandbox whose create says nothing of the
	// network reaches the internet: EgressNone (paddock's default, "" too)
	// or EgressInternet (E2B's).
	DefaultEgress string
	// Domain, when set, is the domain of E2B's sandbox host names
	// (PORT-ID.DOMAIN): requests for such a host are routed to that
	// sandbox's port (49983: its envd), and creates answer it as the
	// sandboxes' domain.
	Domain string
	Logger *slog.Logger
}

// Secrets is the daemon's secret store (egress.SecretStore).
type Secrets interface {
	Create(name string, value []byte) error
	List() []string
	Delete(name string) error
}

// Telemetry is where the facade reads a sandbox's metrics: the telemetry
// hub, as /v1/sandboxes/{id}/metrics does.
type Telemetry interface {
	Metrics(id string, from, to time.Time) (api.Metrics, error)
}

// Server serves the facade.
type Server struct {
	mgr *sandbox.Manager
	tel Telemetry
	log *slog.Logger

	secrets       Secrets
	defaultEgress string
	domain        string
	ingress       http.Handler
	apiKey        string
	tokens        func() []string
	secret        []byte

	control *http.ServeMux
	envd    *http.ServeMux

	mu sync.Mutex
	// tags maps sandbox → process tag → pid, for tag selectors.
	tags map[string]map[string]uint32
	// secretUses are header secrets stored but perhaps not yet recorded.
	secretUses map[string]*secretUse
	// sweep wakes Run for a sweep of header secrets.
	sweep chan struct{}
	// signers maps signatures of URLs that named no sandbox to the
	// sandbox that signed them (signer).
	signers map[string]string
}

// New returns the facade's server.
func New(cfg Config) (*Server, error) {
	if cfg.Token == "" {
		return nil, errors.New("the E2B facade needs the daemon's token (--token-file): its API key is derived from it")
	}
	if len(cfg.Key) < 32 {
		return nil, errors.New("the E2B facade needs a key of 32 bytes or more: its envd access tokens are derived from it")
	}
	switch cfg.DefaultEgress {
	case "", EgressNone, EgressInternet:
	default:
		return nil, fmt.Errorf("the E2B default egress %q is neither %s nor %s", cfg.DefaultEgress, EgressNone, EgressInternet)
	}
	s := &Server{
		secrets:       cfg.Secrets,
		defaultEgress: cfg.DefaultEgress,
		domain:        strings.ToLower(strings.Trim(cfg.Domain, ".")),
		mgr:           cfg.Manager,
		tel:           cfg.Telemetry,
		log:           cfg.Logger,
		apiKey:        APIKey(cfg.Token),
		tokens:        cfg.Tokens,
		secret:        cfg.Key,
		tags:          map[string]map[string]uint32{},
		secretUses:    map[string]*secretUse{},
		sweep:         make(chan struct{}, 1),
		signers:       map[string]string{},
	}
	s.control = s.controlRoutes()
	s.envd = s.envdRoutes()
	s.ingress = s.newIngressProxy()
	return s, nil
}

// APIKey returns the E2B API key that stands for the daemon token token:
// "e2b_" and 40 hex digits (the shape E2B SDKs check), derived with
// HMAC-SHA256 so that the key does not reveal the token.
func APIKey(token string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("paddock e2b api key"))
	return "e2b_" + hex.EncodeToString(m.Sum(nil))[:40]
}

// accessToken is sandbox id's envd access token, derived from the secret
// so that nothing per sandbox is stored.
func (s *Server) accessToken(id string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("envd access token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))[:32]
}

// Handler routes requests carrying E2b-Sandbox-Id to that sandbox's envd
// surface and all others to the control plane.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic serving E2B request", "path", r.URL.Path, "err", v)
				writeAPIError(w, http.StatusInternalServerError, "internal error; see the daemon log")
			}
		}()
		if r.Header.Get("E2b-Sandbox-Id") != "" {
			s.envd.ServeHTTP(w, r)
			return
		}
		if port, id, ok := s.hostTarget(r.Host); ok {
			if port != EnvdPort {
				s.serveIngress(w, r, id, port)
				return
			}
			r.Header.Set("E2b-Sandbox-Id", id)
			s.envd.ServeHTTP(w, r)
			return
		}
		if r.URL.Path == "/files" && r.URL.Query().Has("signature") {
			// A signed URL fetched by a plain client: its sandbox is the
			// one whose token signed it.
			id := s.signer(r)
			if id == "" {
				writeAPIError(w, http.StatusUnauthorized, "invalid signature")
				return
			}
			r.Header.Set("E2b-Sandbox-Id", id)
			s.envd.ServeHTTP(w, r)
			return
		}
		if !s.checkAPIKey(r) {
			writeAPIError(w, http.StatusUnauthorized, "missing or wrong API key (X-API-KEY)")
			return
		}
		connlimit.Authenticated(w, r)
		s.control.ServeHTTP(w, r)
	})
}

func (s *Server) checkAPIKey(r *http.Request) bool {
	got := r.Header.Get("X-API-Key")
	if got == "" {
		got = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	if s.tokens == nil {
		return subtle.ConstantTimeCompare([]byte(got), []byte(s.apiKey)) == 1
	}
	ok := 0
	for _, t := range s.tokens() {
		ok |= subtle.ConstantTimeCompare([]byte(got), []byte(APIKey(t)))
	}
	return ok == 1
}

// apiError is the control plane's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeAPIError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, apiError{Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if v != nil {
		json.NewEncoder(w).Encode(v)
	}
}

// userOf returns the user an envd call runs as: the name in a Basic
// authorization header ("user:" with no password, as the SDKs send it),
// or DefaultUser.
func userOf(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return DefaultUser, nil
	}
	enc, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return "", errdefs.Invalid("authorization", "only Basic authorization names a user")
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", errdefs.Invalid("authorization", "malformed Basic credentials")
	}
	name, _, _ := strings.Cut(string(b), ":")
	if name == "" {
		return DefaultUser, nil
	}
	return name, validUser(name)
}

// validUser refuses names the sandbox's /etc/passwd could not hold.
func validUser(name string) error {
	if len(name) > 32 {
		return errdefs.Invalid("user", "name longer than 32 characters")
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return errdefs.Invalid("user", "%q is not a user name", name)
		}
	}
	return nil
}

// homeOf is a user's home directory in E2B's templates.
func homeOf(user string) string {
	if user == "root" {
		return "/root"
	}
	return "/home/" + user
}
