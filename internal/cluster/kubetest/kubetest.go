// Package kubetest runs a real Kubernetes control plane for tests: etcd
// and kube-apiserver, built from the module proxy by scripts/kube-bins.sh
// (`make kube-bins`), on free ports of 127.0.0.1, with static tokens for
// an administrator, a node and a gateway, and RBAC on. There is no kubelet
// and no controller manager: what the tests need is the API.
package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/deathsig"
	"github.com/paddock-dev/paddock/internal/freeport"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Users the API server knows by their static tokens. Node and Gateway
// are the service accounts deploy/rbac.yaml grants rights to.
const (
	Admin   = "admin"
	Node    = "system:serviceaccount:paddock:paddock-node"
	Gateway = "system:serviceaccount:paddock:paddock-gateway"
	Nobody  = "nobody"
)

// Cluster is a running control plane.
type Cluster struct {
	// URL is the API server's, https://127.0.0.1:PORT.
	URL string
	// CA verifies the API server's self-signed certificate (PEM).
	CA     []byte
	dir    string
	tokens map[string]string // user → token
	procs  []proc
}

// proc is a process of the control plane.
type proc struct {
	cmd  *exec.Cmd
	done <-chan struct{} // closed once it has exited and is reaped
}

// BinDir is where the control plane's binaries are: $PADDOCK_KUBE_BIN,
// or the cache directory scripts/kube-bins.sh builds into.
func BinDir() (string, error) {
	if d := os.Getenv("PADDOCK_KUBE_BIN"); d != "" {
		return d, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		script := filepath.Join(d, "scripts", "kube-bins.sh")
		if _, err := os.Stat(script); err == nil {
			out, err := exec.Command(script, "--print-dir").Output()
			if err != nil {
				return "", fmt.Errorf("%s --print-dir: %w", script, err)
			}
			return strings.TrimSpace(string(out)), nil
		}
		if d == filepath.Dir(d) {
			return "", errors.New("no scripts/kube-bins.sh above " + wd + ", and PADDOCK_KUBE_BIN is not set")
		}
	}
}

// Start starts etcd and kube-apiserver for t, waits until the API server
// is ready, and stops both and removes their files when t ends, failed or
// not. It skips t when the binaries are not built.
func Start(t testing.TB) *Cluster {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Skipf("no Kubernetes control plane: %v", err)
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Skipf("no %s in %s: run `make kube-bins` (about 6 minutes, once)", b, bin)
		}
	}
	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{dir: dir, tokens: map[string]string{}}
	t.Cleanup(c.stop)
	if err := c.start(bin); err != nil {
		t.Fatalf("starting the control plane: %v\n%s", err, c.logs())
	}
	return c
}

func (c *Cluster) start(bin string) error {
	ports, err := freeport.Ports(3)
	if err != nil {
		return err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	if err := c.run(filepath.Join(bin, "etcd"), "etcd.log",
		"--name=kubetest", "--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubetest="+peerURL,
		"--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}
	if err := c.writeCredentials(); err != nil {
		return err
	}
	c.URL = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	if err := c.run(filepath.Join(bin, "kube-apiserver"), "kube-apiserver.log",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[2]),
		"--cert-dir="+filepath.Join(c.dir, "certs"),
		"--token-auth-file="+filepath.Join(c.dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(c.dir, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(c.dir, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--allow-privileged=true", // the node DaemonSet is privileged, as clusters allow
		"--enable-priority-and-fairness=false"); err != nil {
		return err
	}
	return c.waitReady(90 * time.Second)
}

// run starts one of the control plane's processes, its output to a log
// file. It dies with the test binary if that dies first (deathsig: not
// when the thread that started it ends, as other tests' namespace work
// ends threads).
func (c *Cluster) run(path, logName string, args ...string) error {
	f, err := os.Create(filepath.Join(c.dir, logName))
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	done, err := deathsig.Start(cmd)
	if err != nil {
		return fmt.Errorf("starting %s: %w", filepath.Base(path), err)
	}
	c.procs = append(c.procs, proc{cmd, done})
	return nil
}

// writeCredentials writes the token file and the service-account key
// pair the API server needs.
func (c *Cluster) writeCredentials() error {
	var tokens bytes.Buffer
	for _, u := range []struct{ name, groups string }{
		{Admin, "system:masters"},
		{Node, "system:serviceaccounts,system:serviceaccounts:paddock"},
		{Gateway, "system:serviceaccounts,system:serviceaccounts:paddock"},
		{Nobody, ""},
	} {
		b := make([]byte, 16)
		rand.Read(b)
		tok := hex.EncodeToString(b)
		c.tokens[u.name] = tok
		fmt.Fprintf(&tokens, "%s,%s,%s,%q\n", tok, u.name, u.name, u.groups)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "tokens.csv"), tokens.Bytes(), 0o600); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	priv, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: priv}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

// waitReady waits for the API server's certificate and /readyz.
func (c *Cluster) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		for _, p := range c.procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited", filepath.Base(p.cmd.Path))
			default:
			}
		}
		// Read again each time until ready: the API server writes the
		// file (its serving certificate, then the CA that signed it) in
		// place, and a read while it writes can get the first alone,
		// which no probe would ever verify.
		if b, err := os.ReadFile(filepath.Join(c.dir, "certs", "apiserver.crt")); err == nil && len(b) > 0 {
			c.CA = b
		}
		if c.CA != nil {
			code, body, err := c.Get("/readyz", Admin)
			if err == nil && code == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("/readyz: %d %s %v", code, body, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the API server was not ready after %v: %v", limit, last)
}

// Get sends GET path to the API server as user and returns the status
// and body.
func (c *Cluster) Get(path, user string) (int, []byte, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CA)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, c.URL+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.tokens[user])
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Config is a client configuration that authenticates as user.
func (c *Cluster) Config(user string) *rest.Config {
	return &rest.Config{
		Host:            c.URL,
		BearerToken:     c.tokens[user],
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CA},
		QPS:             -1, // no client-side rate limit in tests
	}
}

// Kubeconfig writes a kubeconfig file for user and returns its path.
func (c *Cluster) Kubeconfig(t testing.TB, user string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: c.URL, CertificateAuthorityData: c.CA}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: c.tokens[user]}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: user}
	kc.CurrentContext = "kubetest"
	path := filepath.Join(c.dir, "kubeconfig-"+strings.NewReplacer(":", "-").Replace(user))
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// stop stops the API server, then etcd, and removes their files.
func (c *Cluster) stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	os.RemoveAll(c.dir)
}

// logs is the tail of each process's log, for a failure's message.
func (c *Cluster) logs() string {
	var b strings.Builder
	for _, name := range []string{"etcd.log", "kube-apiserver.log"} {
		data, _ := os.ReadFile(filepath.Join(c.dir, name))
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", name, data)
	}
	return b.String()
}

// waitFor polls cond every 50 ms until it holds or limit passes.
func waitFor(ctx context.Context, limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if cond() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}
