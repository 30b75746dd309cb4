package test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/cluster/kubetest"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/e2b"
)

// trustSecrets writes the cluster's TLS files with paddock cluster-tls
// into dir/all and copies what each side's Secret holds into dir/node and
// dir/gateway, as kubelet would mount them.
func trustSecrets(t *testing.T, dir string) (nodeDir, gwDir string) {
	t.Helper()
	all := filepath.Join(dir, "all")
	if out, err := exec.Command(paddockBin, "cluster-tls", all).CombinedOutput(); err != nil {
		t.Fatalf("paddock cluster-tls: %v\n%s", err, out)
	}
	nodeDir, gwDir = filepath.Join(dir, "node"), filepath.Join(dir, "gateway")
	mount := func(to string, names ...string) {
		os.MkdirAll(to, 0o700)
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(all, n))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(to, "."+n), b, 0o600)
			os.Rename(filepath.Join(to, "."+n), filepath.Join(to, n))
		}
	}
	mount(nodeDir, clustertls.CAFile, clustertls.NodeCACert, clustertls.NodeCAKey)
	mount(gwDir, clustertls.CAFile, clustertls.GatewayCert, clustertls.GatewayKey)
	return nodeDir, gwDir
}

// TestClusterTrust: a node registered with a real kube-apiserver and
// started with --cluster-tls takes only gateways' calls: a client with
// the user's token, or the node's, cannot reach its API or its E2B
// facade; through a gateway (--cluster-tls) everything serves; an envd
// caller's connection is kept only when the node vouches for it, never
// for a header the client sends; new certificates are taken up without
// a restart.
func TestClusterTrust(t *testing.T) {
	t.Parallel()
	kc := kubetest.Start(t)
	kc.Apply(t, "../deploy/crd-paddocknode.yaml", "../deploy/rbac.yaml")
	dir := t.TempDir()
	nodeDir, gwDir := trustSecrets(t, dir)
	token, nodeToken := "client-token-"+randHex(8), "node-token-"+randHex(8)
	nodeTokenFile, tokenFile := filepath.Join(dir, "node.token"), filepath.Join(dir, "client.token")
	os.WriteFile(nodeTokenFile, []byte(nodeToken+"\n"), 0o600)
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)

	addr, e2bAddr := freeHostPort(t), freeHostPort(t)
	newDaemon(t, "--listen", "tcp://"+addr, "--token-file", nodeTokenFile, "--e2b-listen", "tcp://"+e2bAddr,
		"--cluster", "--kubeconfig", kc.Kubeconfig(t, kubetest.Node), "--node-name", "tls-node",
		"--node-address", "https://"+addr, "--node-e2b-address", "https://"+e2bAddr, "--cluster-tls", nodeDir)

	gwAddr, gwE2B := freeHostPort(t), freeHostPort(t)
	gwLog := startGatewayProc(t, "--listen", "tcp://"+gwAddr, "--e2b-listen", "tcp://"+gwE2B,
		"--token-file", tokenFile, "--node-token-file", nodeTokenFile, "--cluster-tls", gwDir,
		"--cluster", "--kubeconfig", kc.Kubeconfig(t, kubetest.Gateway), "--log-level", "debug")
	cl, err := client.New("tcp://"+gwAddr, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if !waitFor(30*time.Second, 50*time.Millisecond, func() bool {
		nodes, err := cl.Nodes(ctx)
		return err == nil && len(nodes) == 1 && nodes[0].State == api.NodeReady
	}) {
		t.Fatalf("the gateway never saw the node ready\n%s", gwLog)
	}

	sb, err := cl.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatalf("create through the gateway: %v", err)
	}
	defer cl.Delete(context.Background(), sb.ID, true)
	// An exec with input takes a connection of its own to the node (an
	// upgrade, spliced): a new TLS handshake each time.
	echo := func() (string, error) {
		var out strings.Builder
		_, err := cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat"}}, client.ExecIO{Stdin: strings.NewReader("through\n"), Stdout: &out})
		return out.String(), err
	}
	if out, err := echo(); err != nil || out != "through\n" {
		t.Fatalf("exec through the gateway: %q, %v", out, err)
	}

	// Straight to the node: the SDK with either token over plain TCP,
	// TLS without a gateway's certificate, TLS with a certificate the
	// node's own CA issued.
	for _, tok := range []string{token, nodeToken} {
		direct, err := client.New("tcp://"+addr, client.WithToken(tok))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := direct.Get(ctx, sb.ID); err == nil {
			t.Errorf("the SDK straight to the node with token %s.. got the sandbox", tok[:6])
		}
		direct.Close()
	}
	anyServer := &tls.Config{InsecureSkipVerify: true}
	for _, target := range []string{"https://" + addr + "/v1/sandboxes/" + sb.ID, "https://" + e2bAddr + "/health"} {
		req, _ := http.NewRequest("GET", target, nil)
		req.Header.Set("Authorization", "Bearer "+nodeToken)
		req.Header.Set("E2b-Sandbox-Id", sb.ID)
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: anyServer}, Timeout: 10 * time.Second}
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("%s without a gateway's certificate: %d", target, resp.StatusCode)
		} else if !strings.Contains(err.Error(), "certificate required") {
			t.Errorf("%s without a gateway's certificate: %v, want the handshake refused", target, err)
		}
	}

	// E2B through the gateway: an envd caller with the sandbox's access
	// token keeps its connection; one with a wrong token and a forged
	// Paddock-Vouched is answered and closed.
	var esb struct{ SandboxID, EnvdAccessToken string }
	esb.SandboxID, esb.EnvdAccessToken = e2bCreate(t, "http://"+gwE2B, e2b.APIKey(token))
	defer cl.Delete(context.Background(), esb.SandboxID, true)
	health := func(token, extra string) (code int, kept bool) {
		t.Helper()
		conn, err := net.Dial("tcp", gwE2B)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "GET /health HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: %s\r\nX-Access-Token: %s\r\n%s\r\n", esb.SandboxID, token, extra)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Header.Get(e2b.VouchedHeader) != "" {
			t.Errorf("the client saw %s", e2b.VouchedHeader)
		}
		conn.SetReadDeadline(time.Now().Add(time.Second))
		_, err = br.ReadByte()
		return resp.StatusCode, err != io.EOF
	}
	if code, kept := health(esb.EnvdAccessToken, ""); code != http.StatusNoContent || !kept {
		t.Errorf("envd /health with the access token: %d, connection kept %v; want 204, kept", code, kept)
	}
	if code, kept := health("wrong", e2b.VouchedHeader+": 1\r\n"); code == http.StatusNoContent || kept {
		t.Errorf("envd /health with a wrong token and a forged %s: %d, connection kept %v; want refused, closed", e2b.VouchedHeader, code, kept)
	}

	// Rotation: new gateway certificates and node CA from the same root,
	// swapped into both mounts; no restart.
	oldCA := readCert(t, filepath.Join(nodeDir, clustertls.NodeCACert))
	nodeDir2, gwDir2 := trustSecrets(t, dir)
	if nodeDir2 != nodeDir || gwDir2 != gwDir {
		t.Fatal("trustSecrets moved")
	}
	newCA := readCert(t, filepath.Join(nodeDir, clustertls.NodeCACert))
	if bytes.Equal(oldCA.SubjectKeyId, newCA.SubjectKeyId) {
		t.Fatal("paddock cluster-tls kept the node CA")
	}
	time.Sleep(1500 * time.Millisecond)
	gwCert, err := tls.LoadX509KeyPair(filepath.Join(gwDir, clustertls.GatewayCert), filepath.Join(gwDir, clustertls.GatewayKey))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{gwCert}})
	if err != nil {
		t.Fatalf("the new gateway certificate, straight to the node: %v", err)
	}
	leaf := conn.ConnectionState().PeerCertificates[0]
	conn.Close()
	if !bytes.Equal(leaf.AuthorityKeyId, newCA.SubjectKeyId) {
		t.Errorf("after the rotation the node shows a certificate of the old CA")
	}
	if out, err := echo(); err != nil || out != "through\n" {
		t.Fatalf("exec through the gateway after the rotation: %q, %v", out, err)
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(path, strings.TrimSuffix(path, ".crt")+".key")
	if err != nil {
		t.Fatal(err)
	}
	x, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// startGatewayProc starts `paddock gateway args...`, stopped when the
// test ends (its log shown if the test failed), and returns its log.
func startGatewayProc(t *testing.T, args ...string) *syncBuffer {
	t.Helper()
	return startGatewayEnv(t, nil, args...)
}

// startGatewayEnv is startGatewayProc with env added to the gateway's
// environment.
func startGatewayEnv(t *testing.T, env []string, args ...string) *syncBuffer {
	t.Helper()
	log := &syncBuffer{}
	gw := exec.Command(paddockBin, append([]string{"gateway"}, args...)...)
	if len(env) > 0 {
		gw.Env = append(os.Environ(), env...)
	}
	gw.Stdout, gw.Stderr = log, log
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		gw.Process.Signal(syscall.SIGTERM)
		gw.Wait()
		if t.Failed() {
			t.Logf("gateway log:\n%s", log)
		}
	})
	return log
}

// e2bCreate creates a sandbox of the host template through the E2B
// control plane at url and returns its id and envd access token.
func e2bCreate(t *testing.T, url, key string) (id, accessToken string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"templateID": "host", "timeout": 60})
	req, _ := http.NewRequest("POST", url+"/sandboxes", bytes.NewReader(body))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	json.NewDecoder(resp.Body).Decode(&sb)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || sb.SandboxID == "" {
		t.Fatalf("E2B create: %d %+v", resp.StatusCode, sb)
	}
	return sb.SandboxID, sb.EnvdAccessToken
}

// mountSecret writes files into dir as kubelet updates a mounted
// Secret: a new directory, one rename of the ..data link, and the files'
// own links into it (made once).
func mountSecret(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	gen, err := os.MkdirTemp(dir, "..gen-")
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(gen, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// TestClusterTokenRotation rotates the node token of a node and a
// gateway (two processes sharing one Secret, swapped as kubelet swaps
// it) while a client calls through the gateway without pause: the native
// API (plain and upgraded calls) and the E2B facade. No call fails; once
// the old token is removed, the node refuses it, on both APIs.
func TestClusterTokenRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	os.MkdirAll(secret, 0o700)
	old, new := "old-node-token-"+randHex(8), "new-node-token-"+randHex(8)
	mountSecret(t, secret, map[string]string{"node.token": old + "\n"})
	token := "client-token-" + randHex(8)
	tokenFile := filepath.Join(dir, "client.token")
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)

	addr, e2bAddr := freeHostPort(t), freeHostPort(t)
	newDaemon(t, "--listen", "tcp://"+addr, "--token-file", filepath.Join(secret, "node.token"), "--id-prefix", "r",
		"--e2b-listen", "tcp://"+e2bAddr)
	gwAddr, gwE2B := freeHostPort(t), freeHostPort(t)
	gwLog := startGatewayProc(t, "--listen", "tcp://"+gwAddr, "--e2b-listen", "tcp://"+gwE2B,
		"--token-file", tokenFile, "--node-token-file", filepath.Join(secret, "node.token"),
		"--node", "n1=r@http://"+addr+",http://"+e2bAddr, "--log-level", "debug")
	cl, err := client.New("tcp://"+gwAddr, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var sb *api.Sandbox
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool {
		sb, err = cl.Create(ctx, api.CreateRequest{})
		return err == nil
	}) {
		t.Fatalf("create through the gateway: %v\n%s", err, gwLog)
	}
	defer cl.Delete(context.Background(), sb.ID, true)

	// get calls base+path with one header.
	get := func(base, path, key, value string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		req.Header.Set(key, value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	stop := make(chan struct{})
	type tally struct {
		calls int
		errs  []string
	}
	done := make(chan tally)
	go func() {
		var n tally
		fail := func(what string, err error) {
			if len(n.errs) < 5 {
				n.errs = append(n.errs, fmt.Sprintf("%s at %s: %v", what, time.Now().Format("15:04:05.000"), err))
			}
		}
		for {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			n.calls++
			if _, err := cl.Get(ctx, sb.ID); err != nil {
				fail("get", err)
			}
			var out strings.Builder
			if _, err := cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat"}}, client.ExecIO{Stdin: strings.NewReader("hi\n"), Stdout: &out}); err != nil || out.String() != "hi\n" {
				fail("exec", fmt.Errorf("%q %v", out.String(), err))
			}
			if code, err := get("http://"+gwE2B, "/sandboxes/"+sb.ID, "X-API-Key", e2b.APIKey(token)); err != nil || code != http.StatusOK {
				fail("e2b get", fmt.Errorf("%d %v", code, err))
			}
		}
	}()
	// The three steps: add the new token (nodes take both, gateways
	// still present the old), swap them (gateways present the new),
	// remove the old. Each waits for every process to re-read the file.
	for _, step := range []string{old + "\n" + new + "\n", new + "\n" + old + "\n", new + "\n"} {
		mountSecret(t, secret, map[string]string{"node.token": step})
		time.Sleep(2500 * time.Millisecond)
	}
	close(stop)
	n := <-done
	t.Logf("%d rounds of calls through the gateway while the token rotated", n.calls)
	if len(n.errs) > 0 || n.calls < 10 {
		t.Fatalf("%d rounds; failed calls: %v\n%s", n.calls, n.errs, gwLog)
	}

	// The node refuses the old token now, natively and as an E2B key.
	for _, tc := range []struct {
		base, path, key, value string
		want                   int
	}{
		{"http://" + addr, "/v1/sandboxes/" + sb.ID, "Authorization", "Bearer " + old, http.StatusUnauthorized},
		{"http://" + addr, "/v1/sandboxes/" + sb.ID, "Authorization", "Bearer " + new, http.StatusOK},
		{"http://" + e2bAddr, "/sandboxes/" + sb.ID, "X-API-Key", e2b.APIKey(old), http.StatusUnauthorized},
		{"http://" + e2bAddr, "/sandboxes/" + sb.ID, "X-API-Key", e2b.APIKey(new), http.StatusOK},
	} {
		if code, err := get(tc.base, tc.path, tc.key, tc.value); err != nil || code != tc.want {
			t.Errorf("%s%s with %s %.12s..: %d %v, want %d", tc.base, tc.path, tc.key, tc.value, code, err, tc.want)
		}
	}
	// A token file that stops loading keeps the last good tokens.
	mountSecret(t, secret, map[string]string{"node.token": "short\n"})
	time.Sleep(1500 * time.Millisecond)
	if _, err := cl.Get(ctx, sb.ID); err != nil {
		t.Fatalf("after a bad token file: %v", err)
	}
}
