package egress

import (
	"crypto/tls"
	"net/http"
	"net/netip"
	"testing"

	"github.com/paddock-dev/paddock/api"
)

// TestInterceptResumes: a client that keeps TLS sessions resumes them on
// its next intercepted connection to the sandbox's proxy (no signature,
// no certificate); another sandbox's proxy sessions do not resume its,
// and a policy change starts afresh.
func TestInterceptResumes(t *testing.T) {
	h := newHarness(t)
	srv := startTLS(t, nil, &echoPath{}, "api.example.com")
	port := itoa(serverAddr(t, srv).Port())
	url := "https://api.example.com:" + port + "/v1/x"
	pol := &api.Policy{Allow: mustRules(t, "https://api.example.com:"+port+"/v1/")}
	h.setPolicy("sb1", pol)
	h.setPolicy("sb2", pol)
	cache := tls.NewLRUClientSessionCache(8)
	resumed := func(id string) bool {
		from := map[string]netip.Addr{"sb1": sb1Addr, "sb2": sb2Addr}[id]
		c := h.client(id, from, serverAddr(t, srv))
		tr := c.Transport.(*http.Transport)
		tr.TLSClientConfig.ClientSessionCache = cache
		tr.TLSClientConfig.RootCAs = h.trust("sb1")
		tr.TLSClientConfig.RootCAs.AppendCertsFromPEM(h.cas["sb2"].CertPEM())
		defer c.CloseIdleConnections()
		_, _, resp := get(t, c, url)
		return resp.TLS.DidResume
	}
	if resumed("sb1") {
		t.Fatal("the first connection resumed")
	}
	if !resumed("sb1") {
		t.Fatal("the second connection of the same sandbox did not resume")
	}
	// The cache (keyed by server name) now offers sb1's ticket to sb2.
	if resumed("sb2") {
		t.Fatal("another sandbox resumed a session of sb1")
	}
	resumed("sb1") // the cache offered sb2's ticket: a full handshake
	if !resumed("sb1") {
		t.Fatal("sb1 did not resume again")
	}
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "https://api.example.com:"+port+"/")})
	if resumed("sb1") {
		t.Fatal("a session resumed across a policy change")
	}
}
