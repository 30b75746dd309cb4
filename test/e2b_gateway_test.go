package test

import (
	"net/http"
	"testing"

	"github.com/paddock-dev/paddock/internal/e2b"
)

// TestClusterE2BTLS runs the unchanged npm e2b SDK against a gateway's
// E2B listener over TLS (--e2b-tls-cert/--e2b-tls-key, a test CA the SDK
// is told to trust) in front of a node: create, commands, files, and
// signed file URLs fetched plainly on the gateway's own name, which the
// gateway routes to the node whose sandbox signed them (expired and
// forged ones get E2B's 401s).
func TestClusterE2BTLS(t *testing.T) {
	dir := npmHarness(t)
	_, caFile, certFile, keyFile := testTLSCert(t, t.TempDir())
	c := startClusterE2B(t, 1, true, "--e2b-tls-cert", certFile, "--e2b-tls-key", keyFile)
	e := &e2bDaemon{Daemon: c.nodes[0], URL: "https://" + c.e2bAddr, APIKey: e2b.APIKey(c.token)}
	t.Setenv("NODE_EXTRA_CA_CERTS", caFile)
	for _, name := range []string{"commands", "files", "signed"} {
		t.Run(name, func(t *testing.T) {
			runScenario(t, e, dir, name)
		})
	}
	// Plain HTTP on the TLS listener gets no E2B answer.
	resp, err := http.Get("http://" + c.e2bAddr + "/sandboxes")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP on the TLS listener: %d, want 400", resp.StatusCode)
		}
	}
}
