package clustertls

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/paddock-dev/paddock/internal/durable"
)

// Lifetimes of what Generate and a node issue. A node's certificate is
// short-lived and renewed at half its life, so a node that lost its
// issuing key (a rotated node-ca) stops being trusted within days.
const (
	rootLife   = 10 * 365 * 24 * time.Hour
	issuedLife = 365 * 24 * time.Hour
	serverLife = 7 * 24 * time.Hour
)

// GenerateOptions says what Generate makes anew.
type GenerateOptions struct {
	// NewCA makes a new root even if dir holds one. Without it, a root in
	// dir (CAFile and CAKey) is kept and only the gateway's certificate
	// and the node-ca are issued again: a rotation nodes and gateways
	// take up without a restart.
	NewCA bool
}

// Generate writes a trust directory's files into dir: the root (CAFile,
// CAKey), the gateway's client certificate and the nodes' issuing CA.
// Keys are written 0600. The gateways' Secret takes CAFile, GatewayCert
// and GatewayKey; the nodes' takes CAFile, NodeCACert and NodeCAKey;
// CAKey stays with the operator.
func Generate(dir string, opts GenerateOptions) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	root, err := loadRoot(dir)
	if opts.NewCA || errors.Is(err, os.ErrNotExist) {
		root, err = newRoot(dir)
	}
	if err != nil {
		return err
	}
	gw := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "paddock-gateway"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := issueFile(dir, GatewayCert, GatewayKey, gw, root, issuedLife); err != nil {
		return err
	}
	nodeCA := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "paddock-node-ca"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		// Everything it issues may serve, nothing may act as a client.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return issueFile(dir, NodeCACert, NodeCAKey, nodeCA, root, issuedLife)
}

func loadRoot(dir string) (tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, CAFile), filepath.Join(dir, CAKey))
	if err != nil {
		return cert, err
	}
	cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0])
	return cert, err
}

func newRoot(dir string) (tls.Certificate, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "paddock cluster CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	if err := issueFile(dir, CAFile, CAKey, tmpl, tls.Certificate{}, rootLife); err != nil {
		return tls.Certificate{}, err
	}
	return loadRoot(dir)
}

// issueFile issues tmpl with a new key, signed by parent (self-signed
// when parent has no leaf), and writes the certificate (with parent's
// chain below the root, for an intermediate's leaves) and the key.
func issueFile(dir, certFile, keyFile string, tmpl *x509.Certificate, parent tls.Certificate, life time.Duration) error {
	cert, err := issue(tmpl, parent, life)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return err
	}
	var certPEM []byte
	for _, c := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c})...)
	}
	if err := durable.WriteFile(filepath.Join(dir, keyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return durable.WriteFile(filepath.Join(dir, certFile), certPEM, 0o644)
}

// issue makes a key and a certificate of tmpl signed by parent (by
// itself when parent has no leaf), valid for life but never past
// parent's end. The chain it returns is the certificate and parent's
// chain without its root.
func issue(tmpl *x509.Certificate, parent tls.Certificate, life time.Duration) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-5 * time.Minute) // clocks a little apart
	tmpl.NotAfter = now.Add(life)
	signer, issuer := crypto.Signer(key), tmpl
	if parent.Leaf != nil {
		signer, issuer = parent.PrivateKey.(crypto.Signer), parent.Leaf
		if tmpl.NotAfter.After(issuer.NotAfter) {
			tmpl.NotAfter = issuer.NotAfter
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, key.Public(), signer)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("issuing %s: %w", tmpl.Subject.CommonName, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	chain := [][]byte{der}
	if parent.Leaf != nil && !isRoot(parent.Leaf) {
		chain = append(chain, parent.Certificate...)
	}
	return tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, nil
}

func isRoot(c *x509.Certificate) bool { return c.CheckSignatureFrom(c) == nil }

// issueServer issues a node its server certificate for hosts from its
// issuing CA, and says when to issue it again (at half its life).
func issueServer(issuer tls.Certificate, hosts []string) (tls.Certificate, time.Time, error) {
	leaf, err := x509.ParseCertificate(issuer.Certificate[0])
	if err != nil {
		return tls.Certificate{}, time.Time{}, err
	}
	issuer.Leaf = leaf
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "paddock-node " + hosts[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	cert, err := issue(tmpl, issuer, serverLife)
	if err != nil {
		return tls.Certificate{}, time.Time{}, err
	}
	renew := cert.Leaf.NotBefore.Add(cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore) / 2)
	return cert, renew, nil
}
