package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
)

// inNetns runs f on a thread inside ns, then puts the thread back.
func inNetns(t *testing.T, ns netns.NsHandle, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer netns.Set(orig)
	f()
}

// TestNftablesRedirect runs the proxy behind a real nftables REDIRECT, the
// way the network package wires it, in two private network namespaces
// ("host" and "sandbox", joined by a veth) so that nothing on the real
// host changes: the sandbox connects to an arbitrary address, the kernel
// redirects it to the proxy, and the proxy reads SO_ORIGINAL_DST. Needs
// root.
func TestNftablesRedirect(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, nftables)")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	hostNS, err1 := netns.New()
	sbNS, err2 := netns.New()
	netns.Set(orig)
	runtime.UnlockOSThread()
	if err1 != nil || err2 != nil {
		t.Skipf("cannot make network namespaces: %v %v", err1, err2)
	}
	t.Cleanup(func() { hostNS.Close(); sbNS.Close(); orig.Close() })

	hh, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	sh, err := netlink.NewHandleAt(sbNS)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pdk-h"}, PeerName: "pdk-s"}
	if err := hh.LinkAdd(veth); err != nil {
		t.Skipf("cannot make a veth: %v", err)
	}
	peer, err := hh.LinkByName("pdk-s")
	if err != nil {
		t.Fatal(err)
	}
	if err := hh.LinkSetNsFd(peer, int(sbNS)); err != nil {
		t.Fatal(err)
	}
	setup := func(h *netlink.Handle, name, cidr string) netlink.Link {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := netlink.ParseAddr(cidr)
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
		lo, _ := h.LinkByName("lo")
		h.LinkSetUp(lo)
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	setup(hh, "pdk-h", "10.99.0.1/30")
	sl := setup(sh, "pdk-s", "10.99.0.2/30")
	if err := sh.RouteAdd(&netlink.Route{LinkIndex: sl.Attrs().Index, Gw: net.ParseIP("10.99.0.1")}); err != nil {
		t.Fatal(err)
	}

	// The proxy's listener lives in the host namespace; its upstream
	// dials come from the test's own namespace, where the servers are.
	var ln net.Listener
	inNetns(t, hostNS, func() { ln, err = net.Listen("tcp4", "0.0.0.0:0") })
	if err != nil {
		t.Fatal(err)
	}
	proxyPort := uint16(ln.Addr().(*net.TCPAddr).Port)

	nft, err := nftables.New(nftables.WithNetNSFd(int(hostNS)))
	if err != nil {
		t.Fatal(err)
	}
	table := nft.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "paddock_test"})
	chain := nft.AddChain(&nftables.Chain{Name: "prerouting", Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	ifname := make([]byte, 16)
	copy(ifname, "pdk-h")
	nft.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(proxyPort)},
		&expr.Redir{RegisterProtoMin: 1},
	}})
	if err := nft.Flush(); err != nil {
		t.Skipf("nftables unavailable: %v", err)
	}

	sandboxIP := netip.MustParseAddr("10.99.0.2")
	h := newHarness(t, func(cfg *ProxyConfig) {
		cfg.Addr, cfg.Listener, cfg.OriginalDst = "", ln, nil // the real SO_ORIGINAL_DST
		cfg.Sandbox = func(a netip.Addr) (string, bool) { return "sb1", a == sandboxIP }
	})
	srv := startTLS(t, nil, &echoPath{}, "open.example.com")
	port := serverAddr(t, srv).Port()
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "open.example.com")})

	// dialFromSandbox connects from inside the sandbox namespace.
	dialFromSandbox := func(addr string) (net.Conn, error) {
		var c net.Conn
		var err error
		inNetns(t, sbNS, func() { c, err = net.DialTimeout("tcp4", addr, 3*time.Second) })
		return c, err
	}
	// An arbitrary address: the redirect, not routing, takes it to the proxy.
	nowhere := "1.2.3.4:" + strconv.Itoa(int(port))
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:     func(context.Context, string, string) (net.Conn, error) { return dialFromSandbox(nowhere) },
		TLSClientConfig: &tls.Config{RootCAs: h.trust("sb1")},
	}}
	resp, err := client.Get("https://open.example.com/through-nft")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "path=/through-nft" {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	client.CloseIdleConnections()

	// A denied raw connection: the event names the original destination
	// the proxy read from the kernel.
	c, err := dialFromSandbox("1.2.3.4:2222")
	if err == nil {
		c.Write([]byte("x"))
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("denied connection: %v", err)
	}
	ev := h.waitEvent("sb1", func(e Event) bool { return e.Kind == KindTCP })
	if ev.IP != "1.2.3.4" || ev.Port != 2222 || ev.Action != "deny" {
		t.Fatalf("event %+v", ev)
	}

	// HTTP_PROXY: a client that connects to the proxy's own address is an
	// explicit proxy client (the redirect maps the address onto itself).
	proxyURL := "http://10.99.0.1:" + strconv.Itoa(int(proxyPort))
	pc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy:           func(*http.Request) (*urlURL, error) { return parseURL(proxyURL) },
		DialContext:     func(_ context.Context, _, addr string) (net.Conn, error) { return dialFromSandbox(addr) },
		TLSClientConfig: &tls.Config{RootCAs: h.trust("sb1")},
	}}
	resp, err = pc.Get("https://open.example.com:" + strconv.Itoa(int(port)) + "/via-proxy-env")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "/via-proxy-env") {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
}

type urlURL = url.URL

func parseURL(s string) (*url.URL, error) { return url.Parse(s) }
