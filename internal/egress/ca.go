package egress

import (
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
	"net/netip"
	"sync"
	"time"
)

// CA is a sandbox's certificate authority (the gateway shares one among
// a generation of sandboxes): the sandbox trusts its certificate
// (installed in its trust store), the daemon keeps its key, and the proxy
// signs leaf certificates with it for the hosts it intercepts. Leaves
// are cached.
//
// Every sandbox has one and most never have a connection intercepted:
// the parsed certificate and the leaves' key are made at the first leaf,
// not kept from the start (3 KiB per sandbox, issue 21).
type CA struct {
	certDER []byte
	key     *ecdsa.PrivateKey

	mu      sync.Mutex
	cert    *x509.Certificate // parsed at the first use
	leafKey *ecdsa.PrivateKey // one key for every leaf: signing is the cost, not keys; made at the first leaf
	leaves  map[string]*tls.Certificate
}

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 7 * 24 * time.Hour
	leafCacheMax = 1024
)

// NewCA makes a CA named for id (a sandbox, or the gateway's generation).
func NewCA(id string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{CommonName: "paddock sandbox " + id + " CA", Organization: []string{"paddock"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	return newCA(der, key)
}

// LoadCA rebuilds a CA from CertPEM and KeyPEM (after a daemon restart).
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || cb.Type != "CERTIFICATE" || kb == nil {
		return nil, errors.New("loading CA: want a CERTIFICATE and a private key in PEM")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("loading CA key: %w", err)
	}
	return newCA(cb.Bytes, key)
}

func newCA(der []byte, key *ecdsa.PrivateKey) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("loading CA: the key does not belong to a CA certificate")
	}
	return &CA{certDER: der, key: key}, nil
}

// signer returns the parsed certificate and the leaves' key, making them
// the first time. ca.mu is held.
func (ca *CA) signer() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	if ca.cert == nil {
		cert, err := x509.ParseCertificate(ca.certDER) // parsed once already by newCA
		if err != nil {
			return nil, nil, fmt.Errorf("parsing CA certificate: %w", err)
		}
		ca.cert = cert
	}
	if ca.leafKey == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, fmt.Errorf("generating leaf key: %w", err)
		}
		ca.leafKey = k
	}
	return ca.cert, ca.leafKey, nil
}

// CertPEM is the certificate to install in the sandbox's trust store.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.certDER})
}

// KeyPEM is the CA's private key, for the daemon's state only: it never
// enters the sandbox.
func (ca *CA) KeyPEM() []byte {
	der, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		panic(err) // a P-256 key always marshals
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

// Certificate is the parsed CA certificate.
func (ca *CA) Certificate() *x509.Certificate {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if ca.cert == nil {
		ca.cert, _ = x509.ParseCertificate(ca.certDER) // parsed once already by newCA
	}
	return ca.cert
}

// Leaf returns a certificate for host (a name or an address) signed by
// the CA, from the cache while it has more than a day left.
func (ca *CA) Leaf(host string) (*tls.Certificate, error) {
	now := time.Now()
	ca.mu.Lock()
	if c, ok := ca.leaves[host]; ok && now.Add(24*time.Hour).Before(c.Leaf.NotAfter) {
		ca.mu.Unlock()
		return c, nil
	}
	caCert, leafKey, err := ca.signer()
	ca.mu.Unlock()
	if err != nil {
		return nil, err
	}

	notAfter := now.Add(leafValidity)
	if notAfter.After(caCert.NotAfter) {
		notAfter = caCert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: randSerial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("signing leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	// The chain is the leaf alone: the sandbox trusts the CA itself, so
	// sending it would cost every handshake bytes and a parse for nothing.
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: leafKey, Leaf: leaf}
	ca.mu.Lock()
	if ca.leaves == nil {
		ca.leaves = map[string]*tls.Certificate{}
	}
	if len(ca.leaves) >= leafCacheMax {
		for k := range ca.leaves { // drop an arbitrary half
			delete(ca.leaves, k)
			if len(ca.leaves) < leafCacheMax/2 {
				break
			}
		}
	}
	ca.leaves[host] = c
	ca.mu.Unlock()
	return c, nil
}

func randSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err)
	}
	return n
}
