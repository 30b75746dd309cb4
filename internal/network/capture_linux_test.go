package network

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/nftables"
)

// A capture sends the sandbox's TCP connections to its sidecar's port,
// with their original destination, but not the sidecar's own (by uid),
// nor those to the gateway; a recycled slot comes back without it.
func TestSlotCapture(t *testing.T) {
	f := newFixture(t)
	s, l := takeAttached(t, f.m, "captured")
	var side *tcpService
	inNS(t, s.FD(), func() { side = startTCP(t, "127.0.0.1:0", "sidecar") })
	dial := fmt.Sprintf(`/usr/bin/python3 -c '
import socket
for a in [("203.0.113.5", 1000), ("%s", 53)]:
    print(socket.create_connection(a, timeout=3).recv(100).decode().strip())
'`, l.HostAddr)

	// The tenant is not the sidecar: its connection is captured.
	if err := f.m.SetCapture("captured", &Capture{Port: side.port, FirstUID: tenantUID + 65536, LastUID: tenantUID + 2*65536 - 1}); err != nil {
		t.Fatal(err)
	}
	out := runTenant(t, s, dial)
	if !strings.Contains(out, "sidecar 203.0.113.5:1000") || !strings.Contains(out, "dnstcp ") {
		t.Fatalf("want the connection at the sidecar with its destination, DNS at the resolver:\n%s", out)
	}
	expectHit(t, "the sidecar", side.hits)
	expectNone(t, "the proxy, behind a capture", f.proxy.hits)

	// The tenant is the sidecar: its connection goes out to the proxy.
	if err := f.m.SetCapture("captured", &Capture{Port: side.port, FirstUID: tenantUID, LastUID: tenantUID + 65535}); err != nil {
		t.Fatal(err)
	}
	out = runTenant(t, s, dial)
	if !strings.Contains(out, "proxy 203.0.113.5:1000") {
		t.Fatalf("want the sidecar's own connection at the proxy:\n%s", out)
	}
	expectNone(t, "the sidecar, for its own connection", side.hits)

	if err := f.m.SetCapture("nobody", &Capture{Port: 1, LastUID: 1}); err == nil {
		t.Error("a capture for a sandbox with no slot was accepted")
	}
	side.ln.Close()
	if err := f.m.Recycle("captured"); err != nil {
		t.Fatal(err)
	}
	waitReady(t, f.m, s)
	c, err := nftables.New(nftables.WithNetNSFd(s.FD()))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		t.Errorf("the recycled slot keeps table %s", tb.Name)
	}
}
