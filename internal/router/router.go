// Package router is a cluster's gateway (`paddock gateway`): it serves
// the /v1 API of many paddock nodes as one. A create is placed on a node
// (readiness, capacity, labels, warm guests, then spread or pack); every
// later call for a sandbox goes to the node whose tag starts the
// sandbox's id, with no lookup; streams are passed on as bytes (spliced
// after an upgrade); lists and metrics are gathered from every node.
//
// It keeps no state of its own but the node table (SetNodes, fed by a
// watch of the cluster or a static list) and what it placed since the
// table last changed, so any number of gateways can serve side by side.
package router

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/server"
)

// Config configures a Router.
type Config struct {
	// Version is what GET /v1/version answers.
	Version api.VersionInfo
	// NodeTokens are the nodes' bearer tokens (a file that rotates): the
	// gateway presents the first, and the nodes' data-plane listeners
	// accept no other.
	NodeTokens *clustertls.Tokens
	// TLS is the gateway's side of the cluster's mutual TLS: with it,
	// nodes are called over TLS only (a node whose address is http is
	// left out of the table), must show a certificate of the cluster's
	// for the host dialled, and see the gateway's client certificate.
	// Nil: nodes are called as their addresses say.
	TLS *clustertls.Gateway
	// Pack places creates on the fullest node that fits, instead of the
	// emptiest (spread, the default).
	Pack bool
	// Defaults are the resources a create that leaves one at zero is
	// counted with when placing it (the nodes' own defaults).
	Defaults api.Resources
	// Drain marks a node draining or ready again where the table comes
	// from (the cluster's PaddockNodes); nil: POST /v1/nodes/NAME/drain
	// answers 409 (a static table is changed where it is written).
	Drain func(ctx context.Context, node string, draining bool) error
	// Archive, when set, is the object store archived sandboxes are
	// found in once their node is gone (archive.go).
	Archive Archive
	// E2BDomain, when set, is the domain of E2B's sandbox host names
	// (PORT-ID.DOMAIN, the nodes' --e2b-domain): such requests go to the
	// id's node with their Host kept, for its facade's port ingress, envd
	// and signed URLs.
	E2BDomain string
	Log       *slog.Logger
}

// Router serves the /v1 API of a cluster's nodes.
type Router struct {
	cfg Config
	log *slog.Logger

	mu    sync.RWMutex
	table *table
	// nodes keeps each node's proxy (and its idle connections) across
	// table updates, by name.
	nodes map[string]*node
	// placed is what this gateway placed on each node since the table
	// last changed, so that a burst of creates does not all land on the
	// node that looked emptiest.
	placed map[string]*placedCount
	// presets lists the cluster's PolicyPresets (SetPresets).
	presets func() []*cluster.PolicyPreset
	// movedTo caches the nodes archived sandboxes moved to (archive.go).
	movedTo moved
	// signers caches which sandbox signed a file URL (e2bsignedcache.go).
	signers signers
}

// New returns a Router with an empty table: every call answers 503 until
// SetNodes gives it nodes.
func New(cfg Config) *Router {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Router{cfg: cfg, log: cfg.Log, table: &table{byTag: map[string]*node{}},
		nodes: map[string]*node{}, placed: map[string]*placedCount{}}
}

// Handler returns the gateway's API: clients must present one of tokens
// as their bearer token (as to a daemon's TCP listener); paths are
// checked as the daemon checks them.
func (rt *Router) Handler(tokens *clustertls.Tokens) http.Handler {
	return server.SanePath(rt.log, rt.noPreviews(server.RequireTokens(tokens, rt.log, forwardCredential(http.HandlerFunc(rt.serve)))))
}

// serve dispatches one request: by the sandbox or snapshot id in its
// path, or to the gateway's own handlers.
func (rt *Router) serve(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, "/v1/sandboxes/"):
		id, _, _ := strings.Cut(strings.TrimPrefix(p, "/v1/sandboxes/"), "/")
		rt.route(w, r, id, id)
		return
	case strings.HasPrefix(p, "/v1/snapshots/"):
		snap, _, _ := strings.Cut(strings.TrimPrefix(p, "/v1/snapshots/"), "/")
		rt.route(w, r, snap, strings.TrimPrefix(snap, snapshotPrefix))
		return
	case strings.HasPrefix(p, "/v1/nodes/"):
		rt.nodeCall(w, r, strings.TrimPrefix(p, "/v1/nodes/"))
		return
	}
	h, ok := rt.own(r.Method, p)
	if !ok {
		h, ok = rt.declared(r.Method, p)
	}
	if !ok {
		server.WriteError(w, r, rt.log, errdefs.New(errdefs.ErrNotFound,
			"%s %s is not served through a cluster gateway (yet): call a node, or see docs/ARCHITECTURE.md", r.Method, p))
		return
	}
	h(w, r)
}

// snapshotPrefix starts every snapshot id (snapshot.Prefix); the rest is
// minted as a sandbox id is, so it starts with its node's tag.
const snapshotPrefix = "snap-"

// own is the gateway's handler of a route that names no sandbox.
func (rt *Router) own(method, path string) (http.HandlerFunc, bool) {
	switch method + " " + path {
	case "GET /v1/version":
		return rt.version, true
	case "GET /v1/nodes":
		return rt.listNodes, true
	case "GET /v1/sandboxes":
		return rt.gather, true
	case "POST /v1/sandboxes":
		return rt.create, true
	case "GET /v1/lane":
		return rt.lane, true
	case "GET /v1/snapshots":
		return rt.gather, true
	case "GET /v1/metrics":
		return rt.gather, true
	case "GET /v1/requests":
		return rt.requests, true
	case "GET /metrics":
		return rt.prometheus, true
	}
	return nil, false
}

// route passes a call for the sandbox (or snapshot) named key, whose
// node-minted part is id, to the node whose tag starts id.
func (rt *Router) route(w http.ResponseWriter, r *http.Request, key, id string) {
	n, err := rt.owner(key, id)
	if err != nil && rt.cfg.Archive != nil && key == id && rt.routeArchived(w, r, id, err) {
		return
	}
	if err != nil {
		server.WriteError(w, r, rt.log, err)
		return
	}
	n.serve(w, r)
}

// owner is the node that made id, serving.
func (rt *Router) owner(key, id string) (*node, error) {
	if n := rt.movedNode(key); n != nil {
		return n, nil // an archived sandbox restored on another node (archive.go)
	}
	rt.mu.RLock()
	t := rt.table
	rt.mu.RUnlock()
	n, err := t.owner(key, id)
	if err != nil {
		return nil, err
	}
	if n.State == api.NodeLost {
		return nil, errdefs.New(errdefs.ErrUnavailable, "node %s (tag %s), which holds %s, is lost: its Lease expired; its sandboxes answer again when it comes back", n.Name, n.Tag, key)
	}
	return n, nil
}

func (rt *Router) version(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, rt.cfg.Version)
}

// listNodes answers GET /v1/nodes: the table as the gateway sees it,
// what it placed since the last update included in Allocated.
func (rt *Router) listNodes(w http.ResponseWriter, r *http.Request) {
	rt.mu.RLock()
	out := make([]api.Node, 0, len(rt.table.nodes))
	for _, n := range rt.table.nodes {
		an := n.Node
		if pc := rt.placed[n.Name]; pc != nil {
			an.Allocated = pc.add(an.Allocated)
		}
		out = append(out, an)
	}
	rt.mu.RUnlock()
	writeJSON(w, http.StatusOK, out)
}
