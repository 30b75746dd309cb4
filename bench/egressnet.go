package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/egress"
)

// The egress benchmark's upstream names: a domain rule allows the first
// (TLS spliced), a URL rule the second (TLS intercepted). Both name the
// same server.
const (
	spliceHost    = "splice.bench.test"
	interceptHost = "intercept.bench.test"
)

// egressNet is the egress benchmark's network: an upstream host (a network
// namespace with an HTTPS server, its certificate from a CA of the run)
// that the host reaches over one veth pair, where paddock's egress proxy
// runs, and a second, plain network namespace ("direct") wired to the
// upstream by a veth pair of its own, where the same client runs with
// paddock out of the path. A DNS server on the host's loopback names the
// upstream for the daemon's resolver. Nothing outside the two namespaces
// changes but one /30 on the host's veth end; close removes all of it.
type egressNet struct {
	log      *slog.Logger
	UpNS     string // the upstream's namespace
	DirectNS string // the direct client's namespace
	hostIf   string
	// UpIP is the upstream's address as the host (so the proxy) sees it;
	// the daemon's resolver answers it for both names.
	UpIP string
	// DirectIP is the upstream's address on the direct link.
	DirectIP string
	CAFile   string // PEM of the CA that signed the server's certificate
	CAName   string // its common name
	DNS      string // ip:port of the DNS server

	srv   *http.Server
	dns   *dns.Server
	made  []func() error // undo steps, in order of making
	mu    sync.Mutex
	close bool
}

// egressTag names the run's interfaces and namespaces (interface names
// have at most 15 bytes).
func egressTag() string { return fmt.Sprintf("%05x", os.Getpid()&0xfffff) }

// newEgressNet builds the network and starts the servers under dir.
func newEgressNet(dir string, log *slog.Logger) (_ *egressNet, retErr error) {
	tag := egressTag()
	n := &egressNet{
		log:      log,
		UpNS:     "paddock-bench-up-" + tag,
		DirectNS: "paddock-bench-direct-" + tag,
		hostIf:   "pbeh" + tag,
	}
	defer func() {
		if retErr != nil {
			n.Close()
		}
	}()
	// Public addresses (the proxy refuses private ones unless a rule names
	// them, as it should), spread by pid: 100.201.0.0/16 for the host link,
	// 100.202.0.0/16 for the direct link, which exists only inside the two
	// namespaces. A clash with another run fails loudly at `ip addr add`.
	blk := os.Getpid() % (256 * 64)
	b, c := blk/64, (blk%64)*4
	hostAddr := fmt.Sprintf("100.201.%d.%d", b, c+1)
	n.UpIP = fmt.Sprintf("100.201.%d.%d", b, c+2)
	n.DirectIP = fmt.Sprintf("100.202.%d.%d", b, c+1)
	directAddr := fmt.Sprintf("100.202.%d.%d", b, c+2)
	upIf, dirUp, dirIf := "pben"+tag, "pbeu"+tag, "pbed"+tag

	steps := []struct {
		args []string
		undo []string
	}{
		{[]string{"netns", "add", n.UpNS}, []string{"netns", "del", n.UpNS}},
		{[]string{"netns", "add", n.DirectNS}, []string{"netns", "del", n.DirectNS}},
		{[]string{"link", "add", n.hostIf, "type", "veth", "peer", "name", upIf}, []string{"link", "del", n.hostIf}},
		{[]string{"link", "set", upIf, "netns", n.UpNS}, nil},
		{[]string{"addr", "add", hostAddr + "/30", "dev", n.hostIf}, nil},
		{[]string{"link", "set", n.hostIf, "up"}, nil},
		{[]string{"-n", n.UpNS, "addr", "add", n.UpIP + "/30", "dev", upIf}, nil},
		{[]string{"-n", n.UpNS, "link", "set", upIf, "up"}, nil},
		{[]string{"-n", n.UpNS, "link", "set", "lo", "up"}, nil},
		{[]string{"-n", n.UpNS, "route", "add", "default", "via", hostAddr}, nil},
		// The direct link is made inside the upstream namespace, so that
		// no end of it is ever on the host.
		{[]string{"-n", n.UpNS, "link", "add", dirUp, "type", "veth", "peer", "name", dirIf, "netns", n.DirectNS}, nil},
		{[]string{"-n", n.UpNS, "addr", "add", n.DirectIP + "/30", "dev", dirUp}, nil},
		{[]string{"-n", n.UpNS, "link", "set", dirUp, "up"}, nil},
		{[]string{"-n", n.DirectNS, "addr", "add", directAddr + "/30", "dev", dirIf}, nil},
		{[]string{"-n", n.DirectNS, "link", "set", dirIf, "up"}, nil},
		{[]string{"-n", n.DirectNS, "link", "set", "lo", "up"}, nil},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s.args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s.args, " "), err, strings.TrimSpace(string(out)))
		}
		if s.undo != nil {
			undo := s.undo
			n.made = append(n.made, func() error {
				if out, err := exec.Command("ip", undo...).CombinedOutput(); err != nil {
					return fmt.Errorf("ip %s: %v: %s", strings.Join(undo, " "), err, strings.TrimSpace(string(out)))
				}
				return nil
			})
		}
	}

	// The upstream's certificates come from a CA of the run, made the way
	// paddock makes a sandbox's.
	ca, err := egress.NewCA("bench upstream")
	if err != nil {
		return nil, err
	}
	n.CAName = ca.Certificate().Subject.CommonName
	n.CAFile = filepath.Join(dir, "upstream-ca.pem")
	if err := os.WriteFile(n.CAFile, ca.CertPEM(), 0o644); err != nil {
		return nil, err
	}
	var certs []tls.Certificate
	for _, host := range []string{spliceHost, interceptHost} {
		c, err := ca.Leaf(host)
		if err != nil {
			return nil, err
		}
		certs = append(certs, *c)
	}
	var ln net.Listener
	if err := inNetns(n.UpNS, func() error {
		var err error
		ln, err = net.Listen("tcp4", "0.0.0.0:443")
		return err
	}); err != nil {
		return nil, fmt.Errorf("listening in %s: %w", n.UpNS, err)
	}
	// HTTP/2 is offered, as real servers do; the clients ask for HTTP/1.1.
	n.srv = &http.Server{Handler: http.HandlerFunc(serveUpstream), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: certs, NextProtos: []string{"h2", "http/1.1"}},
		ErrorLog:  slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go n.srv.ServeTLS(ln, "", "")

	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	n.DNS = pc.LocalAddr().String()
	n.dns = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(n.serveDNS)}
	go n.dns.ActivateAndServe()
	return n, nil
}

// DaemonArgs point a daemon's resolver at the run's DNS server and make
// its proxy trust the run's CA for intercepted upstreams.
func (n *egressNet) DaemonArgs() []string {
	return []string{"--dns-upstream", n.DNS, "--egress-root-ca", n.CAFile}
}

// serveDNS answers A queries for the two names with the upstream's
// address (AAAA: none), and NXDOMAIN for anything else.
func (n *egressNet) serveDNS(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(q)
	if len(q.Question) == 1 {
		name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
		switch {
		case name != spliceHost && name != interceptHost:
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
				A:   net.ParseIP(n.UpIP),
			})
		}
	}
	w.WriteMsg(m)
}

// blob is what the upstream sends for /blob: 1 MiB, repeated.
var blob = func() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}()

// serveUpstream answers /blob?n=N with N bytes and anything else with a
// short body.
func serveUpstream(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/blob" {
		io.WriteString(w, "ok\n")
		return
	}
	n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err != nil || n < 0 {
		http.Error(w, "n must be a byte count", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	for n > 0 {
		m, err := w.Write(blob[:min(n, int64(len(blob)))])
		if err != nil {
			return
		}
		n -= int64(m)
	}
}

// DirectCommand runs argv in the direct namespace.
func (n *egressNet) DirectCommand(argv ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.DirectNS}, argv...)...)
}

// Close stops the servers and removes the namespaces and links. Only the
// first call does anything.
func (n *egressNet) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.close {
		return nil
	}
	n.close = true
	if n.srv != nil {
		n.srv.Close()
	}
	if n.dns != nil {
		n.dns.Shutdown()
	}
	var errs []error
	for i := len(n.made) - 1; i >= 0; i-- {
		errs = append(errs, n.made[i]())
	}
	return errors.Join(errs...)
}

// Leftovers lists the run's namespaces and host links still present.
func (n *egressNet) Leftovers() []string {
	var out []string
	for _, ns := range []string{n.UpNS, n.DirectNS} {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			out = append(out, "network namespace "+ns)
		}
	}
	if _, err := net.InterfaceByName(n.hostIf); err == nil {
		out = append(out, "link "+n.hostIf)
	}
	return out
}

// inNetns runs f on a thread in the named network namespace; sockets it
// opens stay there. The thread is never returned to the scheduler's pool.
func inNetns(name string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread exits with the goroutine
		ns, err := os.Open("/run/netns/" + name)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering %s: %w", name, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}
