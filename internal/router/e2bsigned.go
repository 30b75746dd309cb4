package router

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/e2b"
)

// e2bSigned routes a signed /files URL fetched on the gateway's own name
// (E2B_SANDBOX_URL), which names no sandbox: only the node whose sandbox's
// token signed it can tell, so every node with a facade is asked at once
// (e2b.SignerPath, with its key; each remembers its answers) and the call
// goes to the sandbox the one that knows it names, where the signature is
// checked again, expiry included. None knowing it is E2B's 401. The
// answer is remembered (rt.signers), so that the same URL again asks no
// node.
func (rt *Router) e2bSigned(w http.ResponseWriter, r *http.Request) {
	sig := r.URL.Query().Get("signature")
	now := time.Now()
	id := rt.signers.get(sig, now)
	cached := id != ""
	if !cached {
		id = rt.e2bSigner(r)
	}
	if id == "" {
		writeJSON(w, http.StatusUnauthorized, e2bErrorBody{Code: http.StatusUnauthorized, Message: "invalid signature"})
		return
	}
	if !cached {
		rt.signers.put(sig, id, now, signatureExpiry(r))
	}
	r.Header.Set("E2b-Sandbox-Id", id)
	sw := &statusWriter{ResponseWriter: w}
	rt.e2bRoute(sw, r, id, false)
	if staleSigner(sw.code) {
		rt.signers.drop(sig)
	}
}

// e2bSigner asks the nodes which sandbox signed r's URL; "" when none
// did.
func (rt *Router) e2bSigner(r *http.Request) string {
	rt.mu.RLock()
	nodes := rt.table.nodes
	rt.mu.RUnlock()
	q := r.URL.Query()
	q.Set("method", r.Method)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	found := make(chan string, len(nodes))
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n.e2bProxy == nil || n.State == api.NodeLost {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, e2b.SignerPath+"?"+q.Encode(), nil)
			if err != nil {
				return
			}
			n.asNode(req)
			status, body, err := n.fetch(req, n.e2bBase)
			var ans struct {
				SandboxID string `json:"sandboxID"`
			}
			if err != nil || status != http.StatusOK || json.Unmarshal(body, &ans) != nil || ans.SandboxID == "" {
				return
			}
			found <- ans.SandboxID
		}()
	}
	go func() { wg.Wait(); close(found) }()
	return <-found
}
