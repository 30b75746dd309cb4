package router

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/archive"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// fakeArchive answers records from a map; down makes every read fail.
type fakeArchive struct {
	mu    sync.Mutex
	recs  map[string]archive.Record
	down  bool
	reads int
}

func (f *fakeArchive) Get(ctx context.Context, id string) (archive.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.down {
		return archive.Record{}, errdefs.New(errdefs.ErrUnavailable, "archive store http://s3/bucket: connection refused")
	}
	r, ok := f.recs[id]
	if !ok {
		return r, errdefs.New(errdefs.ErrNotFound, "sandbox %s is not in the archive", id)
	}
	return r, nil
}

// TestRouteArchived: an id whose tag's node is gone is found in the
// archive: calls but a resume answer 409, a resume is placed on a live
// node, which then takes every call; ids the archive does not know keep
// their old answers; a store that does not answer is named.
func TestRouteArchived(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(api.Sandbox{ID: strings.Split(r.URL.Path, "/")[3], State: api.StateRunning})
	}))
	defer node.Close()
	const id = "a00000000001"
	sb, _ := json.Marshal(api.Sandbox{ID: id, Image: "host", Resources: api.Resources{MemoryBytes: 1 << 30}})
	arch := &fakeArchive{recs: map[string]archive.Record{id: {ID: id, Node: "n1", Sandbox: sb, Disk: &archive.Disk{Bytes: 1}}}}
	rt := New(Config{Archive: arch, NodeTokens: tokens(t, "node-token-0123456789")})
	rt.SetNodes([]api.Node{rec("n2", "b", func(n *api.Node) {
		n.Address = node.URL
		n.Capacity = api.NodeResources{CPUs: 8, MemoryBytes: 8 << 30, DiskBytes: 100 << 30, Sandboxes: 10}
	})})
	h := rt.Handler(tokens(t, "client-token-0123456789"))
	call := func(method, path string) (int, string) {
		r := httptest.NewRequest(method, path, nil)
		r.Header.Set("Authorization", "Bearer client-token-0123456789")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}

	if code, body := call("GET", "/v1/sandboxes/"+id); code != http.StatusConflict || !strings.Contains(body, "resume it") {
		t.Fatalf("GET of an archived sandbox: %d %s", code, body)
	}
	if code, body := call("GET", "/v1/sandboxes/a00000000002"); code != http.StatusNotFound || !strings.Contains(body, "no node") {
		t.Fatalf("GET of an id nobody knows: %d %s", code, body)
	}
	if code, body := call("POST", "/v1/sandboxes/"+id+"/resume"); code != http.StatusOK {
		t.Fatalf("resume: %d %s", code, body)
	}
	reads := arch.reads
	if code, body := call("POST", "/v1/sandboxes/"+id+"/exec"); code != http.StatusOK {
		t.Fatalf("a call after the resume: %d %s", code, body)
	}
	if arch.reads != reads {
		t.Errorf("the moved sandbox's node was not cached: %d reads", arch.reads-reads)
	}
	mu.Lock()
	if got := strings.Join(seen, ", "); got != "POST /v1/sandboxes/"+id+"/resume, POST /v1/sandboxes/"+id+"/exec" {
		t.Errorf("node saw %s", got)
	}
	mu.Unlock()

	arch.down = true
	if code, body := call("GET", "/v1/sandboxes/a00000000003"); code != http.StatusServiceUnavailable || !strings.Contains(body, "archive") {
		t.Fatalf("store down: %d %s", code, body)
	}
}
