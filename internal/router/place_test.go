package router

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// answering is a stand-in node's API: it checks the node token and
// answers every create with status and body.
func answering(t *testing.T, status int, body string) string {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer node-token-0123456789" {
			t.Errorf("node called with %q", r.Header.Get("Authorization"))
		}
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/sandboxes":
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			io.WriteString(w, body)
		case r.Method == "GET" && r.URL.Path == "/v1/sandboxes":
			io.WriteString(w, `[{"id":"`+body+`"}]`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// deadAddress is an address nothing listens on.
func deadAddress(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func call(t *testing.T, h http.Handler, method, path, body string) (*httptest.ResponseRecorder, api.Error) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer client-token-0123456789")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var e api.Error
	json.Unmarshal(rec.Body.Bytes(), &e)
	return rec, e
}

// TestCreateGoesOn: a node that refuses a create for want of room (503,
// whatever capacity it published) or does not answer passes it to the
// next; when all refuse, the 503 names each.
func TestCreateGoesOn(t *testing.T) {
	full := answering(t, http.StatusServiceUnavailable, `{"code":"unavailable","message":"memory: no room"}`)
	ok := answering(t, http.StatusCreated, `{"id":"c00000000001"}`)
	rt := New(Config{NodeTokens: tokens(t, "node-token-0123456789")})
	h := rt.Handler(tokens(t, "client-token-0123456789"))
	rt.SetNodes([]api.Node{
		{Name: "n1", Tag: "a", Address: full, State: api.NodeReady},
		{Name: "n2", Tag: "b", Address: deadAddress(t), State: api.NodeReady},
		{Name: "n3", Tag: "c", Address: ok, State: api.NodeReady},
	})
	rec, _ := call(t, h, "POST", "/v1/sandboxes", `{}`)
	if rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), "c00000000001") {
		t.Fatalf("create: %d %s; want node3's 201", rec.Code, rec.Body)
	}

	rt.SetNodes([]api.Node{
		{Name: "n1", Tag: "a", Address: full, State: api.NodeReady},
		{Name: "n2", Tag: "b", Address: deadAddress(t), State: api.NodeReady},
	})
	rec, e := call(t, h, "POST", "/v1/sandboxes", `{}`)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(e.Message, "node n1: memory: no room") || !strings.Contains(e.Message, "node n2 did not answer") {
		t.Fatalf("all refuse: %d %+v", rec.Code, e)
	}
	if rec, e := call(t, h, "POST", "/v1/sandboxes", `{"resources": "x"}`); rec.Code != http.StatusBadRequest || e.Code != "invalid_argument" {
		t.Fatalf("bad body: %d %+v", rec.Code, e)
	}
	if rec, _ := call(t, h, "POST", "/v1/sandboxes", strings.Repeat(" ", 2<<20)); rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("huge body: %d", rec.Code)
	}
}

// TestGatherNamesMissing: a list gathers the nodes that answer, and names
// the ones that do not (lost, or unreachable).
func TestGatherNamesMissing(t *testing.T) {
	rt := New(Config{NodeTokens: tokens(t, "node-token-0123456789")})
	h := rt.Handler(tokens(t, "client-token-0123456789"))
	rt.SetNodes([]api.Node{
		{Name: "n1", Tag: "a", Address: answering(t, 0, "a1"), State: api.NodeReady},
		{Name: "n2", Tag: "b", Address: deadAddress(t), State: api.NodeReady},
		{Name: "n3", Tag: "c", Address: answering(t, 0, "c1"), State: api.NodeLost},
		{Name: "n4", Tag: "d", Address: answering(t, 0, "d1"), State: api.NodeDraining},
	})
	rec, _ := call(t, h, "GET", "/v1/sandboxes", "")
	var got []struct{ ID string }
	json.Unmarshal(rec.Body.Bytes(), &got)
	if rec.Code != http.StatusOK || len(got) != 2 || got[0].ID != "a1" || got[1].ID != "d1" {
		t.Fatalf("list: %d %s", rec.Code, rec.Body)
	}
	if m := rec.Header().Get(MissingNodesHeader); m != "n3, n2" {
		t.Errorf("%s: %q; want n3, n2", MissingNodesHeader, m)
	}
	if rec, _ := call(t, h, "GET", "/v1/templates", ""); rec.Code != http.StatusNotFound {
		t.Errorf("a route the gateway does not serve: %d", rec.Code)
	}
}

// TestPlacedOutlivesHeartbeats: what the gateway placed on a node counts
// until the node publishes a new allocation, not only until the next
// change of its record (a Lease renewal changes its heartbeat).
func TestPlacedOutlivesHeartbeats(t *testing.T) {
	rt := New(Config{})
	full := func(n *api.Node) { n.Capacity = api.NodeResources{Sandboxes: 2} }
	rt.SetNodes([]api.Node{rec("n1", "a", full)})
	d := demand{res: api.NodeResources{Sandboxes: 1}}
	for range 2 {
		if _, _, err := rt.pick(d, map[string]bool{}); err != nil {
			t.Fatal(err)
		}
	}
	rt.SetNodes([]api.Node{rec("n1", "a", full, func(n *api.Node) { n.Heartbeat = time.Now() })})
	if n, _, err := rt.pick(d, map[string]bool{}); err == nil {
		t.Fatalf("a heartbeat forgot the 2 placed: a third went to %s", n.Name)
	}
	rt.SetNodes([]api.Node{rec("n1", "a", full, func(n *api.Node) { n.Allocated.Sandboxes = 1 })})
	if _, _, err := rt.pick(d, map[string]bool{}); err != nil {
		t.Fatalf("after the node published 1 allocated: %v", err)
	}
}
