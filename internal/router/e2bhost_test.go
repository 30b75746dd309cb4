package router

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
)

// TestE2BHostRouting: a request for PORT-ID.DOMAIN goes to the id's
// node with its Host and path as they are (the node's facade serves the
// port, envd or a signed URL by them), with no API key; an id no node
// holds gets E2B's 502; without a domain the Host is not looked at.
func TestE2BHostRouting(t *testing.T) {
	seen := func(node string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, node+" "+r.Host+" "+r.URL.RequestURI()+" key="+r.Header.Get("X-API-Key"))
		}))
		t.Cleanup(s.Close)
		return s
	}
	a, b := seen("a"), seen("b")
	nodes := []api.Node{
		{Name: "na", Tag: "a", Address: "http://127.0.0.1:1", E2BAddress: a.URL, State: api.NodeReady},
		{Name: "nb", Tag: "b", Address: "http://127.0.0.1:1", E2BAddress: b.URL, State: api.NodeReady},
	}
	rt := New(Config{NodeTokens: tokens(t, nodeToken), E2BDomain: "Sandboxes.Example.", Log: quiet})
	rt.SetNodes(nodes)
	gw := httptest.NewServer(rt.E2BHandler(tokens(t, clientToken)))
	t.Cleanup(gw.Close)
	call := func(host, uri string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", gw.URL+uri, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, tc := range []struct{ host, uri, want string }{
		{"8000-a1234.sandboxes.example", "/app/%2e%2e/x?q=1", "a 8000-a1234.sandboxes.example /app/%2e%2e/x?q=1 key="},
		{"49983-b5678.sandboxes.example:443", "/files?path=x&signature=v1_abc", "b 49983-b5678.sandboxes.example:443 /files?path=x&signature=v1_abc key="},
	} {
		if code, body := call(tc.host, tc.uri); code != 200 || body != tc.want {
			t.Errorf("%s%s: %d %q, want %q", tc.host, tc.uri, code, body, tc.want)
		}
	}
	code, body := call("8000-z9999.sandboxes.example", "/")
	var e map[string]string
	if json.Unmarshal([]byte(body), &e) != nil || code != http.StatusBadGateway || e["sandboxId"] != "z9999" || e["message"] != "The sandbox is not running" || e["port"] != "8000" {
		t.Errorf("an id no node holds: %d %s", code, body)
	}
	// Other hosts are the control plane's: the API key is needed.
	for _, host := range []string{"api.sandboxes.example", "8000-a1234.other.example", "x-a1234.sandboxes.example"} {
		if code, body := call(host, "/sandboxes/a1234"); code != http.StatusUnauthorized || !strings.Contains(body, "API key") {
			t.Errorf("host %s: %d %s, want 401", host, code, body)
		}
	}
	plain := New(Config{NodeTokens: tokens(t, nodeToken), Log: quiet})
	plain.SetNodes(nodes)
	gw2 := httptest.NewServer(plain.E2BHandler(tokens(t, clientToken)))
	t.Cleanup(gw2.Close)
	req, _ := http.NewRequest("GET", gw2.URL+"/", nil)
	req.Host = "8000-a1234.sandboxes.example"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without a domain: %d, want 401", resp.StatusCode)
	}
}
