package e2b

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/url"
	"testing"
)

// signedQuery is the query of a URL the SDK signs for sandbox id.
func signedQuery(s *Server, id, path, op string) url.Values {
	sum := sha256.Sum256([]byte(path + ":" + op + "::" + s.accessToken(id)))
	return url.Values{"path": {path}, "signature": {"v1_" + base64.RawStdEncoding.EncodeToString(sum[:])}}
}

func signerServer(n int) (*Server, []string) {
	s := &Server{secret: make([]byte, 32), signers: map[string]string{}}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("sb%010d", i)
	}
	return s, ids
}

func TestSignerAmong(t *testing.T) {
	s, ids := signerServer(50)
	q := signedQuery(s, ids[37], "/home/user/a.txt", "read")
	if got := s.signerAmong(q, "read", ids); got != ids[37] {
		t.Fatalf("signer %q, want %q", got, ids[37])
	}
	if got := s.signerAmong(q, "write", ids); got != "" {
		t.Fatalf("a read signature signed a write for %q", got)
	}
	q.Set("path", "/etc/shadow")
	if got := s.signerAmong(q, "read", ids); got != "" {
		t.Fatalf("a signature moved to another path signed for %q", got)
	}
}

// BenchmarkSignedURLLookup: finding the signer of a URL that names no
// sandbox among 1000, the first time (each token tried; the signer
// last) and again (the remembered signer checked).
func BenchmarkSignedURLLookup(b *testing.B) {
	s, ids := signerServer(1000)
	q := signedQuery(s, ids[len(ids)-1], "/home/user/a.txt", "read")
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			if s.signerAmong(q, "read", ids) == "" {
				b.Fatal("no signer")
			}
		}
	})
	s.signers[q.Get("signature")] = ids[len(ids)-1]
	b.Run("again", func(b *testing.B) {
		for b.Loop() {
			s.mu.Lock()
			id := s.signers[q.Get("signature")]
			s.mu.Unlock()
			if !s.signedBy(q, "read", s.accessToken(id)) {
				b.Fatal("no signer")
			}
		}
	})
}
