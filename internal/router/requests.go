package router

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/server"
)

// Egress requests through a gateway: GET /v1/requests gathers every
// node's; the per-sandbox routes (list, approve, deny) go to the node the
// id names like any other. The decision's audit names the client's
// credential, which only the gateway saw (forwardCredential).

// maxGatheredRequests bounds GET /v1/requests through a gateway: past
// it, the oldest are left out (and counted in LeftOutHeader). A node keeps
// at most 64 a sandbox, so it takes a cluster of many thousands of
// sandboxes asking at once to reach it.
const maxGatheredRequests = 10000

// LeftOutHeader counts, on a gathered list cut to its bound, the items
// left out.
const LeftOutHeader = "Paddock-Left-Out"

// requests answers GET /v1/requests: every node's requests (with the
// client's state filter), oldest first as one daemon sorts them. A node
// that does not answer is named in MissingNodesHeader.
func (rt *Router) requests(w http.ResponseWriter, r *http.Request) {
	parts, ok := rt.gatherJSON(w, r, r.URL.Path, func(b []byte) (any, error) {
		var part []api.EgressRequest
		err := json.Unmarshal(b, &part)
		return part, err
	})
	if !ok {
		return
	}
	out := []api.EgressRequest{}
	for _, part := range parts {
		out = append(out, part.([]api.EgressRequest)...)
	}
	out = sortRequests(out)
	if n := len(out) - maxGatheredRequests; n > 0 {
		w.Header().Set(LeftOutHeader, fmt.Sprint(n))
		out = out[n:]
	}
	writeJSON(w, http.StatusOK, out)
}

// sortRequests sorts requests of several nodes oldest first (the ids
// break ties, so that every gateway answers in one order).
func sortRequests(reqs []api.EgressRequest) []api.EgressRequest {
	slices.SortFunc(reqs, func(a, b api.EgressRequest) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID))
	})
	return reqs
}

// forwardCredential names, on every call the gateway passes to a node,
// the credential its client presented (server.TokenCredential), and
// drops any such name the client sent: the node's audit of a decision
// names it beside the node token the gateway called with.
func forwardCredential(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(server.ForwardedCredentialHeader)
		if a := r.Header.Get("Authorization"); a != "" {
			r.Header.Set(server.ForwardedCredentialHeader, server.TokenCredential(a))
		}
		next.ServeHTTP(w, r)
	})
}
