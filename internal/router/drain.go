package router

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/server"
)

// drainWait bounds how long a drain waits to see its change in the
// gateway's own table (a watch's latency: milliseconds).
const drainWait = 5 * time.Second

// nodeCall serves POST /v1/nodes/NAME/drain and /undrain: the node is
// marked where the table comes from (Config.Drain), and the answer is
// the node once this gateway's table shows the change, so that the
// next create already avoids it.
func (rt *Router) nodeCall(w http.ResponseWriter, r *http.Request, rest string) {
	fail := func(err error) { server.WriteError(w, r, rt.log, err) }
	name, verb, ok := strings.Cut(rest, "/")
	if !ok || (verb != "drain" && verb != "undrain") {
		fail(errdefs.New(errdefs.ErrNotFound, "%s %s is not served: a node takes POST /v1/nodes/NAME/drain or /undrain", r.Method, r.URL.Path))
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		fail(errdefs.New(errdefs.ErrInvalid, "%s %s: only POST", r.Method, r.URL.Path))
		return
	}
	if rt.cfg.Drain == nil {
		fail(errdefs.Conflict("this gateway's nodes come from --node or --nodes-file: set node %s's state to %q there", name, api.NodeDraining))
		return
	}
	draining := verb == "drain"
	if err := rt.cfg.Drain(r.Context(), name, draining); err != nil {
		fail(err)
		return
	}
	n, ok := rt.waitNode(r.Context(), name, func(n api.Node) bool {
		return n.State == api.NodeLost || (n.State == api.NodeDraining) == draining
	})
	if !ok {
		// Marked, but not seen yet: the answer says what the table holds.
		rt.log.Warn("node marked, but the table does not show it yet", "node", name, "draining", draining)
	}
	rt.log.Info("node marked", "node", name, "draining", draining, "state", n.State)
	writeJSON(w, http.StatusOK, n)
}

// waitNode waits until the table's record of the node named name meets
// cond, at most drainWait, and returns it (as it last was).
func (rt *Router) waitNode(ctx context.Context, name string, cond func(api.Node) bool) (api.Node, bool) {
	deadline := time.Now().Add(drainWait)
	for {
		n, found := rt.nodeNamed(name)
		if found && cond(n) {
			return n, true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return n, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (rt *Router) nodeNamed(name string) (api.Node, bool) {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	for _, n := range rt.table.nodes {
		if n.Name == name {
			return n.Node, true
		}
	}
	return api.Node{Name: name}, false
}
