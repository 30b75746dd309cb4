package test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// upstream is a host made for a test: a network namespace joined to the
// host by a veth pair, with real HTTP, HTTPS (certificates from a test CA),
// raw TCP and UDP servers in it, plus a DNS server on the host's loopback
// that names it. Only paddock's egress path (on the host) can reach it
// from a sandbox.
type upstream struct {
	t      *testing.T
	NS     string
	IP     string // the servers' address
	HostIP string // the host side of the veth
	CAFile string // PEM of the test CA that signed the HTTPS certificate
	DNS    string // ip:port of the DNS server
	// Seen records the requests the HTTP servers got, for checks of what
	// reached them (injected secrets, headers).
	mu       sync.Mutex
	seen     []*http.Request
	dnsSeen  []string
	udpSeen  int
	filesDir string
}

var netSeq atomic.Uint32

// newUpstream makes the namespace, servers and DNS; names maps DNS names
// (without the trailing dot) to addresses ("" means the upstream's IP).
func newUpstream(t *testing.T, names map[string]string) *upstream {
	t.Helper()
	n := netSeq.Add(1)
	tag := fmt.Sprintf("%04x%x", os.Getpid()&0xffff, n&0xf)
	u := &upstream{t: t, NS: "pdup" + tag}
	// The upstream stands for a host on the internet, so it has a public
	// address (a private one is reachable only through a rule naming it,
	// and a name resolving to one is refused as DNS rebinding): a /30 of
	// 100.200.0.0/16, routed to the veth only, so nothing real is shadowed
	// beyond those four addresses while the test runs. Spread by pid and
	// sequence so that parallel test binaries rarely meet; a clash fails
	// loudly at `ip addr add`.
	blk := (uint32(os.Getpid())*16 + n) % (256 * 64)
	b, c := blk/64, (blk%64)*4
	u.HostIP = fmt.Sprintf("100.200.%d.%d", b, c+1)
	u.IP = fmt.Sprintf("100.200.%d.%d", b, c+2)
	hostIf, nsIf := "pdh"+tag, "pdn"+tag
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if err := recordOwner(ownerFile(u.NS), owner{NetNS: u.NS, Link: hostIf}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(ownerFile(u.NS)) })
	run("netns", "add", u.NS)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", u.NS).Run() })
	run("link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { exec.Command("ip", "link", "del", hostIf).Run() })
	run("link", "set", nsIf, "netns", u.NS)
	run("addr", "add", u.HostIP+"/30", "dev", hostIf)
	run("link", "set", hostIf, "up")
	run("-n", u.NS, "addr", "add", u.IP+"/30", "dev", nsIf)
	run("-n", u.NS, "link", "set", nsIf, "up")
	run("-n", u.NS, "link", "set", "lo", "up")
	run("-n", u.NS, "route", "add", "default", "via", u.HostIP)

	ca, caKey, caPEM := newTestCA(t)
	u.CAFile = filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(u.CAFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	var dnsNames []string
	for name := range names {
		dnsNames = append(dnsNames, name)
	}
	cert := leafCert(t, ca, caKey, dnsNames, net.ParseIP(u.IP))

	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, r.Clone(r.Context()))
		u.mu.Unlock()
		fmt.Fprintf(w, "hello from %s %s %s\n", r.Host, r.Method, r.URL.Path)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, r.Clone(r.Context()))
		u.mu.Unlock()
		// Echoes what it got, headers included: a secret in them must not
		// come back to the sandbox.
		fmt.Fprintf(w, "auth=%s query=%s\n", r.Header.Get("Authorization"), r.URL.RawQuery)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1<<20)
		for range 8 {
			w.Write(buf)
		}
	})
	// Files under /files/ (a dumb-HTTP git repository among them).
	files := filepath.Join(t.TempDir(), "files")
	os.MkdirAll(files, 0o755)
	mux.Handle("/files/", http.StripPrefix("/files/", http.FileServer(http.Dir(files))))
	u.filesDir = files

	listen := func(network, addr string) net.Listener {
		var ln net.Listener
		var err error
		u.inNS(func() { ln, err = net.Listen(network, addr) })
		if err != nil {
			t.Fatalf("listening on %s in %s: %v", addr, u.NS, err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(listen("tcp4", u.IP+":80"))
	tsrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	go tsrv.ServeTLS(listen("tcp4", u.IP+":443"), "", "")
	t.Cleanup(func() { srv.Close(); tsrv.Close() })
	// Raw TCP echo on 7000 and 7001.
	for _, port := range []string{"7000", "7001"} {
		ln := listen("tcp4", u.IP+":"+port)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); io.Copy(c, c) }()
			}
		}()
	}
	// UDP echo on 9999: a sandbox must not reach it.
	var pc net.PacketConn
	var err error
	u.inNS(func() { pc, err = net.ListenPacket("udp4", u.IP+":9999") })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			u.mu.Lock()
			u.udpSeen++
			u.mu.Unlock()
			pc.WriteTo(buf[:n], a)
		}
	}()

	// DNS on the host's loopback.
	dmux := dns.NewServeMux()
	dmux.HandleFunc(".", func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
		u.mu.Lock()
		u.dnsSeen = append(u.dnsSeen, name)
		u.mu.Unlock()
		addr, ok := names[name]
		if !ok {
			for pat, a := range names {
				if strings.HasPrefix(pat, "*.") && strings.HasSuffix(name, pat[1:]) {
					addr, ok = a, true
				}
			}
		}
		if addr == "" {
			addr = u.IP
		}
		if ok && q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(addr)})
		} else if !ok {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})
	dpc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ds := &dns.Server{PacketConn: dpc, Handler: dmux}
	go ds.ActivateAndServe()
	t.Cleanup(func() { ds.Shutdown() })
	u.DNS = dpc.LocalAddr().String()
	return u
}

// inNS runs f on a thread in the upstream's network namespace; sockets it
// opens stay there.
func (u *upstream) inNS(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with its namespace
		ns, err := os.Open("/run/netns/" + u.NS)
		if err != nil {
			u.t.Error(err)
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			u.t.Error(err)
			return
		}
		f()
	}()
	<-done
}

// requests returns the requests the HTTP servers saw.
func (u *upstream) requests() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.seen...)
}

func (u *upstream) dnsQueries() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.dnsSeen...)
}

func newTestCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "paddock test upstream CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func leafCert(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, names []string, ip net.IP) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "upstream"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		DNSNames:     names,
		IPAddresses:  []net.IP{ip},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// netDaemon starts a daemon whose sandboxes' egress reaches u: its
// resolver asks u's DNS, its proxy trusts u's CA, and its network has a
// name and subnet of its own.
func netDaemon(t *testing.T, u *upstream, extra ...string) *Daemon {
	t.Helper()
	args := append([]string{
		"--dns-upstream", u.DNS,
		"--egress-root-ca", u.CAFile,
	}, extra...)
	return StartDaemon(t, args...)
}

// networkArgs gives a test daemon a network name and subnet of its own, so
// that daemons of parallel tests (and a daemon the developer runs) never
// share an nftables table or addresses. A subnet the host routes already
// (another daemon's, or one a dead test left) is passed over.
func networkArgs() (name string, args []string) {
	n := netSeq.Add(1)
	name = fmt.Sprintf("pt%04x%02x", os.Getpid()&0xffff, n&0xff)
	routes := hostRoutes()
	var subnet *net.IPNet
	for try := uint32(0); try < 4096; try++ {
		blk := (uint32(os.Getpid())*16 + n + try*7) % 4096
		_, subnet, _ = net.ParseCIDR(fmt.Sprintf("10.%d.%d.0/22", 160+blk/64, (blk%64)*4))
		if !routed(routes, subnet) {
			break
		}
	}
	return name, []string{"--network-name", name, "--network-subnet", subnet.String()}
}

// routed reports whether subnet overlaps one of routes.
func routed(routes []*net.IPNet, subnet *net.IPNet) bool {
	return slices.ContainsFunc(routes, func(r *net.IPNet) bool { return r.Contains(subnet.IP) || subnet.Contains(r.IP) })
}

// hostRoutes lists the IPv4 destinations of the host's routes other than
// the default one.
func hostRoutes() []*net.IPNet {
	b, _ := os.ReadFile("/proc/net/route")
	var out []*net.IPNet
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		dst, err1 := strconv.ParseUint(f[1], 16, 32)
		mask, err2 := strconv.ParseUint(f[7], 16, 32)
		if err1 != nil || err2 != nil || mask == 0 {
			continue
		}
		// Little-endian words, as the kernel prints them.
		ip := net.IPv4(byte(dst), byte(dst>>8), byte(dst>>16), byte(dst>>24))
		m := net.IPv4Mask(byte(mask), byte(mask>>8), byte(mask>>16), byte(mask>>24))
		out = append(out, &net.IPNet{IP: ip.Mask(m), Mask: m})
	}
	return out
}
