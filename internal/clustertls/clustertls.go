// Package clustertls is the trust between a cluster's gateways and its
// nodes: the bearer tokens gateways present (Tokens, a token file that
// rotates in place) and the mutual TLS below them.
//
// One root CA (ca.crt; its key stays with the operator, never in the
// cluster) signs two certificates: the gateways' client
// certificate (gateway.crt, client authentication only) and the nodes'
// issuing CA (node-ca.crt, server authentication only), whose key every
// node holds to issue itself a server certificate naming its own
// addresses.
//
// A node accepts a connection only with a client certificate that chains
// to the root for client authentication. A certificate a node issues
// cannot: node-ca's extended key usage forbids it, so a node cannot pose
// as a gateway. A gateway accepts a node only with a server certificate,
// chained to the root, that names the address it dialled: a record
// pointing at an address no node holds gets no request and no credential.
//
// Both sides read their files from a directory (a mounted Kubernetes
// Secret, which kubelet updates in place) and re-read them, at most once
// a second, when a handshake finds them changed: certificates and keys
// rotate without a restart. A file set that does not load keeps the last
// good one, with a log line.
package clustertls

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// The files of a trust directory. A gateway reads CAFile, GatewayCert
// and GatewayKey; a node reads CAFile, NodeCACert and NodeCAKey. CAKey is
// only Generate's.
const (
	CAFile      = "ca.crt"
	CAKey       = "ca.key"
	GatewayCert = "gateway.crt"
	GatewayKey  = "gateway.key"
	NodeCACert  = "node-ca.crt"
	NodeCAKey   = "node-ca.key"
)

// recheck is how often a handshake may look at the files again.
const recheck = time.Second

// source keeps the parsed contents of a set of files, re-read when a
// caller finds them older than recheck and parsed again when their bytes
// (or stale, for what was made from them) say so.
type source[T any] struct {
	what  string // for the log: "TLS files", "token file"
	dir   string
	files []string
	parse func(files [][]byte) (*T, error)
	stale func(*T) bool // made from the same files, but due again (a node's certificate)
	log   *slog.Logger

	cur     atomic.Pointer[T]
	checked atomic.Int64 // unix nanoseconds of the last look
	mu      sync.Mutex   // one reload at a time
	raw     [][]byte
}

// load reads and parses the files; the first load's error is the caller's.
func (s *source[T]) load() error {
	raw, err := s.read()
	if err != nil {
		return err
	}
	v, err := s.parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", s.dir, err)
	}
	s.raw = raw
	s.cur.Store(v)
	s.checked.Store(time.Now().UnixNano())
	return nil
}

func (s *source[T]) read() ([][]byte, error) {
	raw := make([][]byte, len(s.files))
	for i, f := range s.files {
		b, err := os.ReadFile(filepath.Join(s.dir, f))
		if err != nil {
			return nil, fmt.Errorf("reading the %s: %w", s.what, err)
		}
		raw[i] = b
	}
	return raw, nil
}

// get is the current value, reloaded first if the files changed.
func (s *source[T]) get() *T {
	now := time.Now()
	if now.UnixNano()-s.checked.Load() < int64(recheck) || !s.mu.TryLock() {
		return s.cur.Load()
	}
	defer s.mu.Unlock()
	s.checked.Store(now.UnixNano())
	raw, err := s.read()
	if err != nil {
		s.log.Warn("keeping the last "+s.what, "dir", s.dir, "err", err)
		return s.cur.Load()
	}
	cur := s.cur.Load()
	if equal(raw, s.raw) && (s.stale == nil || !s.stale(cur)) {
		return cur
	}
	v, err := s.parse(raw)
	if err != nil {
		s.log.Warn("keeping the last "+s.what, "dir", s.dir, "err", err)
		return cur
	}
	s.raw = raw
	s.cur.Store(v)
	s.log.Info(s.what+" loaded", "dir", s.dir)
	return v
}

func equal(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// pool parses PEM certificates (several while a root rotates: the old
// and the new).
func pool(pem []byte) (*x509.CertPool, error) {
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", CAFile)
	}
	return p, nil
}

// Gateway is a gateway's side: the roots nodes' certificates must chain
// to and the client certificate it presents.
type Gateway struct {
	src *source[gatewayState]
}

type gatewayState struct {
	roots *x509.CertPool
	cert  tls.Certificate
}

// LoadGateway loads dir's CAFile, GatewayCert and GatewayKey.
func LoadGateway(dir string, log *slog.Logger) (*Gateway, error) {
	g := &Gateway{src: &source[gatewayState]{what: "cluster TLS files", dir: dir, files: []string{CAFile, GatewayCert, GatewayKey}, log: log,
		parse: func(f [][]byte) (*gatewayState, error) {
			roots, err := pool(f[0])
			if err != nil {
				return nil, err
			}
			cert, err := tls.X509KeyPair(f[1], f[2])
			if err != nil {
				return nil, fmt.Errorf("%s and %s: %w", GatewayCert, GatewayKey, err)
			}
			return &gatewayState{roots: roots, cert: cert}, nil
		}}}
	if err := g.src.load(); err != nil {
		return nil, err
	}
	return g, nil
}

// Config is the client configuration for dialling the node at host (its
// address's host: a name or an IP its certificate must hold).
func (g *Gateway) Config(host string) *tls.Config {
	s := g.src.get()
	return &tls.Config{
		RootCAs:      s.roots,
		ServerName:   host,
		Certificates: []tls.Certificate{s.cert},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS13,
	}
}

// Node is a node's side: the roots gateways' certificates must chain to,
// and the server certificate it issues itself for its hosts.
type Node struct {
	src *source[nodeState]
}

type nodeState struct {
	cfg   *tls.Config
	renew time.Time // when the certificate is due again
}

// LoadNode loads dir's CAFile, NodeCACert and NodeCAKey and issues the
// node a certificate for hosts (names or IPs: the hosts of the addresses
// gateways call it at).
func LoadNode(dir string, hosts []string, log *slog.Logger) (*Node, error) {
	if len(hosts) == 0 {
		return nil, errors.New("a node's TLS certificate needs the hosts gateways call it at")
	}
	n := &Node{src: &source[nodeState]{what: "cluster TLS files", dir: dir, files: []string{CAFile, NodeCACert, NodeCAKey}, log: log,
		stale: func(s *nodeState) bool { return time.Now().After(s.renew) },
		parse: func(f [][]byte) (*nodeState, error) {
			roots, err := pool(f[0])
			if err != nil {
				return nil, err
			}
			issuer, err := tls.X509KeyPair(f[1], f[2])
			if err != nil {
				return nil, fmt.Errorf("%s and %s: %w", NodeCACert, NodeCAKey, err)
			}
			cert, renew, err := issueServer(issuer, hosts)
			if err != nil {
				return nil, err
			}
			return &nodeState{renew: renew, cfg: &tls.Config{
				Certificates: []tls.Certificate{cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    roots,
				NextProtos:   []string{"http/1.1"},
				MinVersion:   tls.VersionTLS13,
			}}, nil
		}}}
	if err := n.src.load(); err != nil {
		return nil, err
	}
	return n, nil
}

// ServerConfig is the configuration of the node's TLS listeners: each
// handshake takes the current files' certificate and roots.
func (n *Node) ServerConfig() *tls.Config {
	return &tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return n.src.get().cfg, nil },
		NextProtos:         []string{"http/1.1"},
		MinVersion:         tls.VersionTLS13,
	}
}
