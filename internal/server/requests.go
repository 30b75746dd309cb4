package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// requestRoutes are sandboxes' egress requests: listed, approved and
// denied by people (a sandbox asks through its self endpoint).
func (s *Server) requestRoutes() []route {
	return []route{
		{"GET /v1/requests", s.listRequests},
		{"GET /v1/sandboxes/{id}/requests", s.listRequests},
		{"POST /v1/sandboxes/{id}/requests/{rid}/approve", s.decideRequest(true)},
		{"POST /v1/sandboxes/{id}/requests/{rid}/deny", s.decideRequest(false)},
	}
}

func (s *Server) listRequests(w http.ResponseWriter, r *http.Request) {
	state := r.URL.Query().Get("state")
	switch state {
	case "", api.RequestPending, api.RequestApproved, api.RequestDenied, api.RequestExpired:
	default:
		writeError(w, r, s.log, errdefs.Invalid("state", "%q is not a state (pending, approved, denied, expired)", state))
		return
	}
	list, err := s.mgr.EgressRequests(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	out := list[:0]
	for _, req := range list {
		if state == "" || req.State == state {
			out = append(out, req)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) decideRequest(approve bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var d api.RequestDecision
		if r.ContentLength != 0 {
			if err := decode(w, r, &d); err != nil {
				writeError(w, r, s.log, err)
				return
			}
		}
		req, err := s.mgr.DecideEgress(r.Context(), r.PathValue("id"), r.PathValue("rid"), approve, d, decider(r))
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		writeJSON(w, http.StatusOK, req)
	}
}

// ForwardedCredentialHeader is how a cluster's gateway names the
// credential its client presented (TokenCredential) on the calls it
// passes to a node.
const ForwardedCredentialHeader = "Paddock-Forwarded-Credential"

// TokenCredential names the bearer token of an Authorization header by a
// fingerprint, never the token: "token 3f2a91c0".
func TokenCredential(authorization string) string {
	sum := sha256.Sum256([]byte(strings.TrimPrefix(authorization, "Bearer ")))
	return "token " + hex.EncodeToString(sum[:4])
}

// forwardedCredential reports whether v is what TokenCredential makes.
func forwardedCredential(v string) bool {
	fp, ok := strings.CutPrefix(v, "token ")
	if !ok || len(fp) != 8 {
		return false
	}
	_, err := hex.DecodeString(fp)
	return err == nil && strings.ToLower(fp) == fp
}

// ClientHeader is how a client names itself ("cli", "console"); the
// audit of a decision records the name with the credential it came with.
const ClientHeader = "Paddock-Client"

type credentialKey struct{}

// withCredential notes in each request's context which credential let it
// in: the unix socket (its file permissions), or a token (decider names it
// by a fingerprint of the one presented, never the token).
func withCredential(byToken bool, next http.Handler) http.Handler {
	cred := "unix socket"
	if byToken {
		cred = byTokenCred
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), credentialKey{}, cred)))
	})
}

// byTokenCred marks a request let in by the token it presented.
const byTokenCred = "token"

// decider names who made a call, for an audit event: the client's own
// name (untrusted: letters, digits and .-_ only, at most 32) and the
// credential it used, as in "cli (unix socket)".
func decider(r *http.Request) string {
	name := r.Header.Get(ClientHeader)
	if len(name) > 32 || name == "" || strings.ContainsFunc(name, func(c rune) bool {
		return !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_')
	}) {
		name = "api"
	}
	cred, _ := r.Context().Value(credentialKey{}).(string)
	if cred == byTokenCred {
		cred = TokenCredential(r.Header.Get("Authorization"))
		// A cluster's gateway presents the node token and names the
		// client's own token beside it: both go in the audit, so a
		// holder of the token cannot pass for another.
		if fwd := r.Header.Get(ForwardedCredentialHeader); forwardedCredential(fwd) {
			cred = fwd + " at a gateway, which called with " + cred
		}
	}
	if cred == "" {
		cred = "in process"
	}
	return name + " (" + cred + ")"
}
