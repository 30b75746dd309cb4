package router

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/e2b"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestE2BFollowsMoved: node a holds a stale stub of sandbox a1234, which
// node b restored from the archive; a's facade answers envd calls with
// E2B's 502 and control calls with 404, both naming b. The gateway
// follows to b, body and all, and sends later calls to b directly. A
// call whose body it did not keep, or a move to a node not in the
// table, answers 503 saying what to do.
func TestE2BFollowsMoved(t *testing.T) {
	var aCalls atomic.Int32
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		aCalls.Add(1)
		io.Copy(io.Discard, r.Body)
		to := "nb"
		if strings.Contains(r.URL.Path, "gone") {
			to = "nz"
		}
		w.Header().Set(errdefs.MovedHeader, to)
		if r.Header.Get("E2b-Sandbox-Id") != "" {
			w.WriteHeader(http.StatusBadGateway)
		} else {
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(a.Close)
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		io.WriteString(w, "b "+r.Method+" "+r.URL.Path+" key="+r.Header.Get("X-API-Key")+" body="+string(body))
	}))
	t.Cleanup(b.Close)
	rt := New(Config{NodeTokens: tokens(t, nodeToken), Log: quiet})
	rt.SetNodes([]api.Node{
		{Name: "na", Tag: "a", Address: "http://127.0.0.1:1", E2BAddress: a.URL, State: api.NodeReady},
		{Name: "nb", Tag: "b", Address: "http://127.0.0.1:1", E2BAddress: b.URL, State: api.NodeReady},
	})
	gw := httptest.NewServer(rt.E2BHandler(tokens(t, clientToken)))
	t.Cleanup(gw.Close)
	call := func(method, path, id string, body io.Reader) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, gw.URL+path, body)
		if id != "" {
			req.Header.Set("E2b-Sandbox-Id", id)
		} else {
			req.Header.Set("X-API-Key", e2b.APIKey(clientToken))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.Header.Get(errdefs.MovedHeader) != "" {
			t.Errorf("%s %s: the node's %s reached the client", method, path, errdefs.MovedHeader)
		}
		return resp.StatusCode, string(out)
	}
	// An envd call with a body: followed, the body sent again.
	code, got := call("POST", "/filesystem.Filesystem/Stat", "a1234", strings.NewReader(`{"path":"/x"}`))
	if code != 200 || got != `b POST /filesystem.Filesystem/Stat key= body={"path":"/x"}` || aCalls.Load() != 1 {
		t.Fatalf("envd call for a moved sandbox: %d %q (a called %d times)", code, got, aCalls.Load())
	}
	// The next ones go to b at once, control calls with b's key.
	code, got = call("GET", "/sandboxes/a1234", "", nil)
	if code != 200 || got != "b GET /sandboxes/a1234 key="+e2b.APIKey(nodeToken)+" body=" || aCalls.Load() != 1 {
		t.Fatalf("control call after the move: %d %q (a called %d times)", code, got, aCalls.Load())
	}
	// A control call the cache does not know yet: followed too.
	code, got = call("POST", "/sandboxes/a5678/timeout", "", strings.NewReader(`{"timeout":60}`))
	if code != 200 || got != "b POST /sandboxes/a5678/timeout key="+e2b.APIKey(nodeToken)+` body={"timeout":60}` {
		t.Fatalf("control call for a moved sandbox: %d %q", code, got)
	}
	// A body of unknown length is not kept: 503, and the retry goes to b.
	code, got = call("POST", "/files", "a9999", io.MultiReader(strings.NewReader("big upload")))
	if code != http.StatusServiceUnavailable || !strings.Contains(got, "try the call again") {
		t.Fatalf("upload for a moved sandbox: %d %q", code, got)
	}
	if code, got = call("POST", "/files", "a9999", io.MultiReader(strings.NewReader("big upload"))); code != 200 || !strings.HasSuffix(got, "body=big upload") {
		t.Fatalf("upload again: %d %q", code, got)
	}
	// Moved to a node the gateway does not know.
	code, got = call("GET", "/gone", "a4321", nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(got, "nz") {
		t.Fatalf("moved to an unknown node: %d %q", code, got)
	}
}
