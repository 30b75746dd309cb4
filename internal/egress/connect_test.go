package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// TestConnectSlowClientHello: a client whose ClientHello comes late after
// CONNECT (a loaded machine; the proxy's peek gives up on silence after
// PeekTimeout) still gets the tunnel its host's TLS rule allows, spliced
// or intercepted. Silence after a CONNECT means "the server speaks first"
// only where an address rule could allow the raw connection.
func TestConnectSlowClientHello(t *testing.T) {
	h := newHarness(t, func(c *ProxyConfig) { c.PeekTimeout = 50 * time.Millisecond; c.SilentTimeout = 2 * time.Second })
	srv := startTLS(t, nil, &echoPath{}, "open.example.com", "api.example.com")
	port := itoa(serverAddr(t, srv).Port())
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "open.example.com", "https://api.example.com:"+port+"/v1/")})
	for _, host := range []string{"open.example.com", "api.example.com"} {
		t.Run(host, func(t *testing.T) {
			c, err := h.dial(context.Background(), sb1Addr, netip.AddrPort{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "CONNECT "+host+":"+port+" HTTP/1.1\r\nHost: "+host+":"+port+"\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("CONNECT: %v %v", resp, err)
			}
			time.Sleep(200 * time.Millisecond) // well past PeekTimeout
			tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: h.trust("sb1")})
			io.WriteString(tc, "GET /v1/x HTTP/1.1\r\nHost: "+host+":"+port+"\r\nConnection: close\r\n\r\n")
			got, err := io.ReadAll(tc)
			if err != nil || !strings.Contains(string(got), "path=/v1/x") {
				t.Fatalf("through the tunnel: %v %q", err, got)
			}
		})
	}
}
