package router

import (
	"net/http"
	"strconv"
	"sync"
	"time"
)

// signers remembers which sandbox signed a file URL, by its signature, so
// that fetching the same signed URL again (a retry, a second download, a
// browser's range requests) goes straight to the sandbox's node instead
// of asking every node (e2bSigner). An entry lasts signerTTL, or until the
// signature expires if sooner, and is dropped when the call it routed is
// answered 401, 404 or 502 (the signature no longer holds, or the sandbox
// is gone): the next fetch asks the nodes again. Where the sandbox is
// comes from the table (its id's tag, or movedTo), never from here.
type signers struct {
	mu sync.Mutex
	m  map[string]signerEntry
}

type signerEntry struct {
	id    string
	until time.Time
}

const (
	signerTTL = 5 * time.Minute
	// maxSigners bounds the cache: past it, expired entries go, then
	// arbitrary ones.
	maxSigners = 4096
)

func (s *signers) get(sig string, now time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[sig]
	if !ok {
		return ""
	}
	if !now.Before(e.until) {
		delete(s.m, sig)
		return ""
	}
	return e.id
}

// put remembers that sandbox id signed sig; expires is the signature's
// own expiry (zero: none).
func (s *signers) put(sig, id string, now, expires time.Time) {
	until := now.Add(signerTTL)
	if !expires.IsZero() && expires.Before(until) {
		until = expires
	}
	if !now.Before(until) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]signerEntry{}
	}
	if _, ok := s.m[sig]; !ok && len(s.m) >= maxSigners {
		for k, e := range s.m {
			if !now.Before(e.until) {
				delete(s.m, k)
			}
		}
		for k := range s.m {
			if len(s.m) < maxSigners {
				break
			}
			delete(s.m, k)
		}
	}
	s.m[sig] = signerEntry{id: id, until: until}
}

func (s *signers) drop(sig string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, sig)
}

// signatureExpiry reads a signed URL's signature_expiration (Unix
// seconds); zero when absent or unreadable.
func signatureExpiry(r *http.Request) time.Time {
	sec, err := strconv.ParseInt(r.URL.Query().Get("signature_expiration"), 10, 64)
	if err != nil || sec <= 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0)
}

// staleSigner reports whether an answer to a call routed by a cached
// signer says the entry is wrong.
func staleSigner(code int) bool {
	return code == http.StatusUnauthorized || code == http.StatusNotFound || code == http.StatusBadGateway
}

// statusWriter records the status a handler answers.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
