package router

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestDrainCall: POST /v1/nodes/NAME/drain marks the node where the
// table comes from and answers once the table shows it; a draining node
// takes no creates and still routes; bad calls get clear errors.
func TestDrainCall(t *testing.T) {
	rt := New(Config{})
	nodes := []api.Node{rec("n1", "a"), rec("n2", "b")}
	rt.SetNodes(nodes)
	rt.cfg.Drain = func(ctx context.Context, name string, draining bool) error {
		if name == "down" {
			return errdefs.New(errdefs.ErrUnavailable, "the API server did not answer")
		}
		found := false
		for i := range nodes {
			if nodes[i].Name == name {
				found = true
				nodes[i].State = api.NodeReady
				if draining {
					nodes[i].State = api.NodeDraining
				}
			}
		}
		if !found {
			return errdefs.New(errdefs.ErrNotFound, "no node %s", name)
		}
		go rt.SetNodes(append([]api.Node(nil), nodes...)) // as a watch would, later
		return nil
	}
	h := rt.Handler(tokens(t, "client-token-0123456789"))
	call := func(method, path string) (int, string) {
		req := httptest.NewRequest(method, path, nil)
		req.Header.Set("Authorization", "Bearer client-token-0123456789")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}

	code, body := call("POST", "/v1/nodes/n1/drain")
	var n api.Node
	if code != http.StatusOK || json.Unmarshal([]byte(body), &n) != nil || n.Name != "n1" || n.State != api.NodeDraining {
		t.Fatalf("drain: %d %s", code, body)
	}
	d := demand{res: api.NodeResources{Sandboxes: 1}}
	for range 3 {
		if got, _, err := rt.pick(d, map[string]bool{}); err != nil || got.Name != "n2" {
			t.Fatalf("pick with n1 draining: %v, %v; want n2", got, err)
		}
	}
	if got, err := rt.owner("a00000000000", "a00000000000"); err != nil || got.Name != "n1" {
		t.Errorf("a draining node's sandbox: %v, %v; want routed to n1", got, err)
	}
	if code, body := call("POST", "/v1/nodes/n2/drain"); code != http.StatusOK {
		t.Fatalf("drain n2: %d %s", code, body)
	}
	if _, _, err := rt.pick(d, map[string]bool{}); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "2 draining") {
		t.Errorf("pick with every node draining: %v; want unavailable saying 2 draining", err)
	}
	code, body = call("POST", "/v1/nodes/n1/undrain")
	if code != http.StatusOK || !strings.Contains(body, `"state":"ready"`) {
		t.Fatalf("undrain: %d %s", code, body)
	}

	for _, tc := range []struct {
		method, path string
		code         int
		msg          string
	}{
		{"POST", "/v1/nodes/nosuch/drain", http.StatusNotFound, "no node nosuch"},
		{"POST", "/v1/nodes/down/drain", http.StatusServiceUnavailable, "did not answer"},
		{"GET", "/v1/nodes/n1/drain", http.StatusBadRequest, "only POST"},
		{"POST", "/v1/nodes/n1/reboot", http.StatusNotFound, "drain or /undrain"},
		{"POST", "/v1/nodes/n1", http.StatusNotFound, "drain or /undrain"},
	} {
		if code, body := call(tc.method, tc.path); code != tc.code || !strings.Contains(body, tc.msg) {
			t.Errorf("%s %s: %d %s; want %d naming %q", tc.method, tc.path, code, body, tc.code, tc.msg)
		}
	}

	rt.cfg.Drain = nil // a static table
	if code, body := call("POST", "/v1/nodes/n1/drain"); code != http.StatusConflict || !strings.Contains(body, "--nodes-file") {
		t.Errorf("drain on a static table: %d %s; want 409", code, body)
	}
}
