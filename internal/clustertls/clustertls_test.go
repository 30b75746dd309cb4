package clustertls

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var quiet = slog.New(slog.DiscardHandler)

// generate makes a trust directory.
func generate(t *testing.T, opts GenerateOptions) string {
	t.Helper()
	dir := t.TempDir()
	if err := Generate(dir, opts); err != nil {
		t.Fatal(err)
	}
	return dir
}

// serveNode serves "node" over the node's TLS on a loopback port.
func serveNode(t *testing.T, n *Node) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "node") }),
		ErrorLog: slog.NewLogLogger(quiet.Handler(), slog.LevelDebug)}
	go hs.Serve(tls.NewListener(l, n.ServerConfig()))
	t.Cleanup(func() { hs.Close() })
	return l.Addr().String()
}

// call makes one request to addr over a fresh TLS connection of cfg.
func call(addr string, cfg *tls.Config) (string, error) {
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := c.Get("https://" + addr + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func copyFiles(t *testing.T, from, to string, names ...string) {
	t.Helper()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(from, n))
		if err != nil {
			t.Fatal(err)
		}
		// As kubelet updates a mounted Secret: a new file renamed over.
		tmp := filepath.Join(to, "."+n+".new")
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(to, n)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMutualTLS(t *testing.T) {
	dir := generate(t, GenerateOptions{})
	node, err := LoadNode(dir, []string{"127.0.0.1", "node.example"}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveNode(t, node)
	gw, err := LoadGateway(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := call(addr, gw.Config("127.0.0.1")); err != nil || got != "node" {
		t.Fatalf("gateway → node: %q, %v", got, err)
	}

	roots := gw.Config("127.0.0.1").RootCAs
	other := generate(t, GenerateOptions{})
	otherGW, err := LoadGateway(other, quiet)
	if err != nil {
		t.Fatal(err)
	}
	// What a node holds: its issuing CA, which can sign a certificate
	// asking for client authentication.
	nodeCA, err := tls.LoadX509KeyPair(filepath.Join(dir, NodeCACert), filepath.Join(dir, NodeCAKey))
	if err != nil {
		t.Fatal(err)
	}
	nodeCA.Leaf, _ = x509.ParseCertificate(nodeCA.Certificate[0])
	minted, err := issue(&x509.Certificate{Subject: pkix.Name{CommonName: "paddock-gateway"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, nodeCA, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The node's own server certificate, as a client's.
	own := node.src.get().cfg.Certificates[0]

	for _, tc := range []struct {
		name string
		cfg  *tls.Config
		want string
	}{
		{"no client certificate (a client with only the user's token)", &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}, "certificate required"},
		{"another cluster's gateway", &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", Certificates: otherGW.Config("x").Certificates}, "unknown certificate authority"},
		{"a client certificate a node minted", &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", Certificates: []tls.Certificate{minted}}, "bad certificate"},
		{"a node's server certificate", &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", Certificates: []tls.Certificate{own}}, "bad certificate"},
		{"a node of another cluster (the gateway's roots)", otherGW.Config("127.0.0.1"), "certificate signed by unknown authority"},
		{"an address the node's certificate does not name", gw.Config("127.0.0.2"), "127.0.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := call(addr, tc.cfg)
			if err == nil {
				t.Fatalf("answered %q, want refused", got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("refused with %v, want %q", err, tc.want)
			}
		})
	}

	// Plain HTTP to the TLS port gets no API.
	resp, err := http.Get("http://" + addr + "/")
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(b), "node") {
			t.Errorf("plain HTTP answered %d %q", resp.StatusCode, b)
		}
	}
}

// TestRotation: new roots, gateway certificates and node CAs are taken up
// by the next handshakes, without a restart; a file set that does not
// load keeps the last good one.
func TestRotation(t *testing.T) {
	nodeDir := generate(t, GenerateOptions{})
	node, err := LoadNode(nodeDir, []string{"127.0.0.1"}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveNode(t, node)
	gwDir := generate(t, GenerateOptions{})
	gw, err := LoadGateway(gwDir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := call(addr, gw.Config("127.0.0.1")); err == nil {
		t.Fatal("a gateway of another root was let in")
	}
	// The node trusts both roots for a while (a bundle), and issues
	// itself a certificate from the gateway's root's node CA.
	a, _ := os.ReadFile(filepath.Join(nodeDir, CAFile))
	b, _ := os.ReadFile(filepath.Join(gwDir, CAFile))
	os.WriteFile(filepath.Join(nodeDir, CAFile), append(a, b...), 0o644)
	copyFiles(t, gwDir, nodeDir, NodeCACert, NodeCAKey)
	time.Sleep(recheck + 100*time.Millisecond)
	if got, err := call(addr, gw.Config("127.0.0.1")); err != nil || got != "node" {
		t.Fatalf("after the rotation: %q, %v", got, err)
	}

	// A new gateway certificate from the same root: the gateway presents
	// it from its next handshake.
	before := gw.Config("x").Certificates[0].Certificate[0]
	if err := Generate(gwDir, GenerateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(recheck + 100*time.Millisecond)
	after := gw.Config("127.0.0.1")
	if string(after.Certificates[0].Certificate[0]) == string(before) {
		t.Fatal("the gateway kept its old certificate")
	}
	if got, err := call(addr, after); err != nil || got != "node" {
		t.Fatalf("with the gateway's new certificate: %q, %v", got, err)
	}

	// A broken file keeps the last good set.
	os.WriteFile(filepath.Join(nodeDir, NodeCAKey), []byte("not a key"), 0o600)
	time.Sleep(recheck + 100*time.Millisecond)
	if got, err := call(addr, gw.Config("127.0.0.1")); err != nil || got != "node" {
		t.Fatalf("after a broken file: %q, %v", got, err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := generate(t, GenerateOptions{})
	if _, err := LoadNode(dir, nil, quiet); err == nil {
		t.Error("a node without hosts loaded")
	}
	empty := t.TempDir()
	if _, err := LoadGateway(empty, quiet); err == nil || !strings.Contains(err.Error(), CAFile) {
		t.Errorf("an empty directory: %v", err)
	}
	os.WriteFile(filepath.Join(empty, CAFile), []byte("junk"), 0o644)
	os.WriteFile(filepath.Join(empty, GatewayCert), []byte("junk"), 0o644)
	os.WriteFile(filepath.Join(empty, GatewayKey), []byte("junk"), 0o600)
	if _, err := LoadGateway(empty, quiet); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("junk files: %v", err)
	}
	// Generate keeps a root it finds, unless told otherwise.
	root, _ := os.ReadFile(filepath.Join(dir, CAFile))
	if err := Generate(dir, GenerateOptions{}); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, CAFile)); string(again) != string(root) {
		t.Error("Generate replaced the root")
	}
	if err := Generate(dir, GenerateOptions{NewCA: true}); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, CAFile)); string(again) == string(root) {
		t.Error("Generate with NewCA kept the root")
	}
}
