package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/server"
)

// requestsNode is a stand-in node holding reqs: it answers GET
// /v1/requests as a daemon does (its state filter, 400 for a bad one)
// and notes the credential the gateway forwarded on each decision.
func requestsNode(t *testing.T, reqs []api.EgressRequest, forwarded chan<- string) string {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer node-token-0123456789" {
			t.Errorf("node called with %q", r.Header.Get("Authorization"))
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "GET" && r.URL.Path == "/v1/requests":
			state := r.URL.Query().Get("state")
			if state != "" && state != api.RequestPending {
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprintf(w, `{"code":"invalid_argument","message":"state: %s is not a state"}`, state)
				return
			}
			out := []api.EgressRequest{}
			for _, r := range reqs {
				if state == "" || r.State == state {
					out = append(out, r)
				}
			}
			json.NewEncoder(w).Encode(out)
		case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/approve"):
			forwarded <- r.Header.Get(server.ForwardedCredentialHeader)
			json.NewEncoder(w).Encode(api.EgressRequest{ID: "x", State: api.RequestApproved})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// TestGatherRequests: GET /v1/requests through a gateway merges every
// node's requests oldest first, with the client's filter; a node that
// does not answer is named, a bad filter is the node's 400; the list is
// bounded, its oldest left out and counted.
func TestGatherRequests(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	req := func(id string, sec int, state string) api.EgressRequest {
		return api.EgressRequest{ID: id, Sandbox: strings.Split(id, ".")[0], Host: "h.test", State: state, Created: t0.Add(time.Duration(sec) * time.Second)}
	}
	a := []api.EgressRequest{req("a1.1", 1, api.RequestPending), req("a1.2", 4, api.RequestDenied), req("a2.1", 5, api.RequestPending)}
	b := []api.EgressRequest{req("b1.1", 2, api.RequestApproved), req("b1.2", 3, api.RequestPending), req("b2.1", 5, api.RequestPending)}
	rt := New(Config{NodeTokens: tokens(t, "node-token-0123456789")})
	h := rt.Handler(tokens(t, "client-token-0123456789"))
	rt.SetNodes([]api.Node{
		{Name: "n1", Tag: "a", Address: requestsNode(t, a, nil), State: api.NodeReady},
		{Name: "n2", Tag: "b", Address: requestsNode(t, b, nil), State: api.NodeReady},
		{Name: "n3", Tag: "c", Address: deadAddress(t), State: api.NodeReady},
	})
	ids := func(rec *httptest.ResponseRecorder) string {
		var got []api.EgressRequest
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%d %s: %v", rec.Code, rec.Body, err)
		}
		var out []string
		for _, r := range got {
			out = append(out, r.ID)
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct{ query, want string }{
		{"", "a1.1 b1.1 b1.2 a1.2 a2.1 b2.1"},
		{"?state=pending", "a1.1 b1.2 a2.1 b2.1"},
	} {
		rec, _ := call(t, h, "GET", "/v1/requests"+tc.query, "")
		if got := ids(rec); rec.Code != http.StatusOK || got != tc.want {
			t.Errorf("GET /v1/requests%s: %d %q; want %q", tc.query, rec.Code, got, tc.want)
		}
		if m := rec.Header().Get(MissingNodesHeader); m != "n3" {
			t.Errorf("%s: %q; want n3", MissingNodesHeader, m)
		}
	}
	if rec, e := call(t, h, "GET", "/v1/requests?state=bogus", ""); rec.Code != http.StatusBadRequest || !strings.Contains(e.Message, "bogus") {
		t.Errorf("a bad state: %d %+v", rec.Code, e)
	}

	// Past the bound: the newest stay.
	var many []api.EgressRequest
	for i := range maxGatheredRequests + 5 {
		many = append(many, req(fmt.Sprintf("a1.%d", i+1), i, api.RequestDenied))
	}
	rt.SetNodes([]api.Node{{Name: "n1", Tag: "a", Address: requestsNode(t, many, nil), State: api.NodeReady}})
	rec, _ := call(t, h, "GET", "/v1/requests", "")
	var got []api.EgressRequest
	json.Unmarshal(rec.Body.Bytes(), &got)
	if len(got) != maxGatheredRequests || got[0].ID != "a1.6" || rec.Header().Get(LeftOutHeader) != "5" {
		t.Errorf("past the bound: %d requests from %s, %s %q", len(got), got[0].ID, LeftOutHeader, rec.Header().Get(LeftOutHeader))
	}
}

// TestDecisionForwardsCredential: a decision through a gateway reaches
// the node that holds the sandbox with the client's credential named
// (never the token), and a name the client sent itself is dropped.
func TestDecisionForwardsCredential(t *testing.T) {
	forwarded := make(chan string, 1)
	rt := New(Config{NodeTokens: tokens(t, "node-token-0123456789")})
	h := rt.Handler(tokens(t, "client-token-0123456789"))
	rt.SetNodes([]api.Node{
		{Name: "n1", Tag: "a", Address: deadAddress(t), State: api.NodeReady},
		{Name: "n2", Tag: "b", Address: requestsNode(t, nil, forwarded), State: api.NodeReady},
	})
	req := httptest.NewRequest("POST", "/v1/sandboxes/b0000000001/requests/b0000000001.1/approve", nil)
	req.Header.Set("Authorization", "Bearer client-token-0123456789")
	req.Header.Set(server.ForwardedCredentialHeader, "token 00000000")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("approve: %d %s", rec.Code, rec.Body)
	}
	want := server.TokenCredential("Bearer client-token-0123456789")
	if got := <-forwarded; got != want || strings.Contains(got, "client-token") {
		t.Errorf("the node saw %q; want %q", got, want)
	}
	if rec, e := call(t, h, "POST", "/v1/sandboxes/z0000000001/requests/z0000000001.1/approve", ""); rec.Code != http.StatusNotFound || !strings.Contains(e.Message, "z0000000001") {
		t.Errorf("a request of a tag no node has: %d %+v", rec.Code, e)
	}
}
