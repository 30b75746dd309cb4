package test

import (
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/paddock-dev/paddock/api"
)

// TestClusterAgentSurfaces (issue 26 on a cluster): a real API server,
// two registered nodes and a gateway. MCP through the gateway, as `paddock
// mcp` pointed at it and as the gateway's own /mcp, runs the whole tool
// flow over sandboxes on both nodes; the gateway's console logs in and
// opens the terminal of a sandbox on the second node; a preview URL asked
// for at the gateway is the second node's (on its --preview-listen) and
// reaches the dev server, while the gateway answers its path with a clear
// 404 and a node without a preview listener says so.
func TestClusterAgentSurfaces(t *testing.T) {
	t.Parallel()
	paddr := freeHostPort(t)
	c := startKubeCluster(t, 1, []string{"--node-labels", "room=first"}, []string{"--node-labels", "room=second", "--preview-listen", "tcp://" + paddr})
	g := c.gateways[0]
	gw := g.client

	t.Run("mcp-stdio", func(t *testing.T) {
		cmd := exec.Command(paddockBin, "--host", "tcp://"+g.addr, "mcp")
		cmd.Env = append(os.Environ(), "PADDOCK_TOKEN="+c.token)
		cmd.Stderr = os.Stderr
		p := &mcpProgress{}
		mcpFlow(t, mcpOpen(t, "stdio", &sdk.CommandTransport{Command: cmd}, p), p)
	})
	t.Run("mcp-http", func(t *testing.T) {
		p := &mcpProgress{}
		tr := &sdk.StreamableClientTransport{Endpoint: "http://" + g.addr + "/mcp",
			HTTPClient: &http.Client{Transport: bearer{c.token, http.DefaultTransport}}}
		mcpFlow(t, mcpOpen(t, "http", tr, p), p)
		req, _ := http.NewRequest(http.MethodPost, "http://"+g.addr+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("the gateway's /mcp without the token: %d, want 401", resp.StatusCode)
		}
	})

	ctx := t.Context()
	second, err := gw.Create(ctx, api.CreateRequest{NodeSelector: map[string]string{"room": "second"}})
	if err != nil || second.Node != "f2" {
		t.Fatalf("a create for room=second: %+v, %v", second, err)
	}
	t.Run("console", func(t *testing.T) {
		consoleSession(t, "http://"+g.addr, c.token, second.ID)
	})

	t.Run("preview", func(t *testing.T) {
		sh := func(id, script string) execResult { return runVia(t, gw, id, "", "sh", "-c", script) }
		sh(second.ID, "mkdir -p /tmp/site && echo hello-preview > /tmp/site/index.html && cd /tmp/site && nohup python3 -m http.server 3000 --bind 127.0.0.1 >/tmp/site.log 2>&1 &")
		if r := runVia(t, gw, second.ID, "", "bash", "-c", `for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/3000) 2>/dev/null && exit 0; sleep 0.05; done; cat /tmp/site.log; exit 1`); r.ExitCode != 0 {
			t.Fatalf("http.server did not listen: %s", r)
		}
		out := c.cli(0, "port", second.ID, "3000", "--url")
		u, err := url.Parse(strings.TrimSpace(out.Stdout))
		if out.Code != 0 || err != nil || u.Host != paddr || !strings.HasPrefix(u.Path, "/preview/"+second.ID+".") {
			t.Fatalf("paddock port --url at the gateway: %+v", out)
		}
		hc := &http.Client{Timeout: 10 * time.Second}
		if code, body := previewGet(t, hc, u.String()); code != 200 || !strings.Contains(body, "hello-preview") {
			t.Fatalf("the preview URL: %d %s", code, body)
		}
		if code, body := previewGet(t, hc, "http://"+g.addr+u.Path+"?"+u.RawQuery); code != 404 || !strings.Contains(body, "--preview-listen") {
			t.Fatalf("the preview's path at the gateway: %d %s", code, body)
		}
		first, err := gw.Create(ctx, api.CreateRequest{NodeSelector: map[string]string{"room": "first"}})
		if err != nil || first.Node != "f1" {
			t.Fatalf("a create for the first node: %+v, %v", first, err)
		}
		if out := c.cli(0, "port", first.ID, "3000", "--url"); out.Code == 0 || !strings.Contains(out.Stderr, "--preview-listen") {
			t.Fatalf("a preview on a node without a preview listener: %+v", out)
		}
	})
}
