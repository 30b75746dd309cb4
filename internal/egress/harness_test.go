package egress

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
)

// The test network, all on loopback:
//
//	127.0.0.1      the proxy's listener
//	127.0.0.2/.3   sandboxes sb1 and sb2 (the client's source address)
//	127.0.0.10     "the internet": public in these tests, where servers listen
//
// Names resolve through the harness's resolver; a name not listed there
// resolves to 127.0.0.10.
var (
	sb1Addr    = netip.MustParseAddr("127.0.0.2")
	sb2Addr    = netip.MustParseAddr("127.0.0.3")
	publicAddr = netip.MustParseAddr("127.0.0.10")
)

func testPublic(a netip.Addr) bool { return a == publicAddr || PublicAddr(a) }

// testServerCA signs the upstream servers' certificates.
var testServerCA = func() *CA {
	ca, err := NewCA("upstream-test")
	if err != nil {
		panic(err)
	}
	return ca
}()

// serverCert signs a certificate for names with ca.
func serverCert(t testing.TB, ca *CA, names ...string) tls.Certificate {
	t.Helper()
	ca.mu.Lock()
	caCert, key, err := ca.signer()
	ca.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: randSerial(),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		DNSNames:     names,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// listenPublic listens on the test internet.
func listenPublic(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(publicAddr.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// startTLS serves h over TLS on the test internet with a certificate for
// names signed by ca (testServerCA when nil).
func startTLS(t testing.TB, ca *CA, h http.Handler, names ...string) *httptest.Server {
	t.Helper()
	if ca == nil {
		ca = testServerCA
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = listenPublic(t)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert(t, ca, names...)}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func startHTTP(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = listenPublic(t)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func serverAddr(t testing.TB, srv *httptest.Server) netip.AddrPort {
	t.Helper()
	return addrPort(srv.Listener.Addr())
}

type harness struct {
	t      testing.TB
	eng    *Engine
	proxy  *Proxy
	store  *SecretStore
	names  map[string][]netip.Addr
	dsts   sync.Map // client address → simulated original destination
	mu     sync.Mutex
	cas    map[string]*CA
	events []taggedEvent
	evCh   chan struct{}
}

type taggedEvent struct {
	id string
	Event
}

type harnessOpt func(*ProxyConfig)

func newHarness(t testing.TB, opts ...harnessOpt) *harness {
	t.Helper()
	h := &harness{t: t, names: map[string][]netip.Addr{}, cas: map[string]*CA{}, evCh: make(chan struct{}, 1)}
	h.eng = NewEngine(EngineConfig{Public: testPublic})
	store, err := OpenSecretStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h.store = store
	for _, id := range []string{"sb1", "sb2"} {
		ca, err := NewCA(id)
		if err != nil {
			t.Fatal(err)
		}
		h.cas[id] = ca
	}
	pool := x509.NewCertPool()
	pool.AddCert(testServerCA.Certificate())
	cfg := ProxyConfig{
		Addr:   "127.0.0.1:0",
		Engine: h.eng,
		Sandbox: func(a netip.Addr) (string, bool) {
			switch a {
			case sb1Addr:
				return "sb1", true
			case sb2Addr:
				return "sb2", true
			}
			return "", false
		},
		OriginalDst: func(c net.Conn) (netip.AddrPort, error) {
			if v, ok := h.dsts.Load(addrPort(c.RemoteAddr())); ok {
				return v.(netip.AddrPort), nil
			}
			return netip.AddrPort{}, errNoOriginalDst
		},
		CA: func(id string) (*CA, error) {
			if ca := h.cas[id]; ca != nil {
				return ca, nil
			}
			return nil, errors.New("no CA")
		},
		Secrets: store,
		Resolve: func(ctx context.Context, name string) ([]netip.Addr, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if a, ok := h.names[name]; ok {
				return a, nil
			}
			if strings.HasSuffix(name, ".invalid") {
				return nil, errors.New("no such host")
			}
			return []netip.Addr{publicAddr}, nil
		},
		RootCAs: pool,
		Events: func(id string, e Event) {
			h.mu.Lock()
			h.events = append(h.events, taggedEvent{id, e})
			h.mu.Unlock()
			select {
			case h.evCh <- struct{}{}:
			default:
			}
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	p, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.proxy = p
	t.Cleanup(func() { p.Close() })
	return h
}

func (h *harness) setPolicy(id string, p *api.Policy) {
	h.t.Helper()
	if err := h.eng.Set(id, p); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) resolveTo(name string, addrs ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var as []netip.Addr
	for _, a := range addrs {
		as = append(as, netip.MustParseAddr(a))
	}
	h.names[name] = as
}

// dial connects to the proxy from the sandbox's address, as if the
// sandbox had connected to dst and been redirected (dst invalid: as an
// explicit proxy client).
func (h *harness) dial(ctx context.Context, from netip.Addr, dst netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		c.Control(func(fd uintptr) {
			if err = unix.Bind(int(fd), &unix.SockaddrInet4{Addr: from.As4()}); err != nil {
				return
			}
			var sa unix.Sockaddr
			if sa, err = unix.Getsockname(int(fd)); err == nil && dst.IsValid() {
				h.dsts.Store(netip.AddrPortFrom(from, uint16(sa.(*unix.SockaddrInet4).Port)), dst)
			}
		})
		return err
	}}
	return d.DialContext(ctx, "tcp", h.proxy.Addr().String())
}

// trust is the pool a sandbox's client trusts: its own CA (installed by
// paddock) and the upstream test CA (standing in for the public roots).
func (h *harness) trust(id string) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(h.cas[id].Certificate())
	pool.AddCert(testServerCA.Certificate())
	return pool
}

// client is an HTTP client in sandbox id (at from) whose every connection
// is redirected to the proxy with original destination dst.
func (h *harness) client(id string, from netip.Addr, dst netip.AddrPort) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return h.dial(ctx, from, dst)
			},
			TLSClientConfig:   &tls.Config{RootCAs: h.trust(id)},
			ForceAttemptHTTP2: false,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       10 * time.Second,
	}
}

// proxyClient is a client in sandbox id that uses the proxy through
// HTTP_PROXY/HTTPS_PROXY.
func (h *harness) proxyClient(id string, from netip.Addr) *http.Client {
	u, _ := http.NewRequest("GET", "http://"+h.proxy.Addr().String(), nil)
	return &http.Client{
		Transport: &http.Transport{
			Proxy: http.ProxyURL(u.URL),
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return h.dial(ctx, from, netip.AddrPort{})
			},
			TLSClientConfig: &tls.Config{RootCAs: h.trust(id)},
		},
		Timeout: 10 * time.Second,
	}
}

// waitEvent waits for an event of sandbox id that pred accepts.
func (h *harness) waitEvent(id string, pred func(Event) bool) Event {
	h.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		h.mu.Lock()
		for _, e := range h.events {
			if e.id == id && pred(e.Event) {
				h.mu.Unlock()
				return e.Event
			}
		}
		h.mu.Unlock()
		select {
		case <-h.evCh:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			h.mu.Lock()
			defer h.mu.Unlock()
			for _, e := range h.events {
				h.t.Logf("event %s: %+v", e.id, e.Event)
			}
			h.t.Fatalf("no matching event for %s", id)
			return Event{}
		}
	}
}
