package egress

import (
	"crypto/tls"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/paddock-dev/paddock/api"
)

// TestUpstreamProtocolFollowsClient: an intercepted request goes upstream
// in the HTTP version its client spoke, even to an upstream that offers
// HTTP/2: an HTTP/1.1 client is not moved to HTTP/2 (slower for bulk),
// and an HTTP/2 client (gRPC) keeps HTTP/2 end to end.
func TestUpstreamProtocolFollowsClient(t *testing.T) {
	h := newHarness(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}))
	srv.Listener.Close()
	srv.Listener = listenPublic(t)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert(t, testServerCA, "api.example.com")}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	port := itoa(serverAddr(t, srv).Port())
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "https://api.example.com:"+port+"/")})
	for _, h2 := range []bool{false, true} {
		c := h.client("sb1", sb1Addr, serverAddr(t, srv))
		c.Transport.(*http.Transport).ForceAttemptHTTP2 = h2
		want := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]
		for range 2 { // a new upstream connection, then a pooled one
			code, body, resp := get(t, c, "https://api.example.com:"+port+"/proto")
			if code != 200 || resp.Proto != want || body != want {
				t.Fatalf("client spoke %s: got %d over %s, upstream saw %q", want, code, resp.Proto, body)
			}
		}
		c.CloseIdleConnections()
	}
}
