package router

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/archive"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/server"
)

// A sandbox archived to the object store (package archive) outlives its
// node, and its id keeps the old node's tag. The gateway routes by the
// tag as ever while that node serves (it holds the archived sandbox's
// stub and restores it on resume). When the tag names no live node, the
// gateway reads the sandbox's one small record in the store: the node
// it names (the one that restored it) takes the call, or, for a resume
// of a sandbox no live node holds, a node placed as a create is, which
// restores it. What the store says is cached per id; nothing is written
// to etcd.

// Archive is where the gateway finds sandboxes archived off their node
// (*archive.Store).
type Archive interface {
	Get(ctx context.Context, id string) (archive.Record, error)
}

// archiveLookup bounds a read of the store on a call's path.
const archiveLookup = 5 * time.Second

// maxMoved bounds the cache of moved sandboxes (cleared when full).
const maxMoved = 1 << 16

// moved is the gateway's cache of sandboxes that run on another node than
// their tag's: id → node name.
type moved struct {
	n  atomic.Int64 // len(m)
	mu sync.Mutex
	m  map[string]string
}

func (mv *moved) get(id string) (string, bool) {
	if mv.n.Load() == 0 {
		return "", false // nothing moved: no lock on the call's path
	}
	mv.mu.Lock()
	defer mv.mu.Unlock()
	n, ok := mv.m[id]
	return n, ok
}

func (mv *moved) set(id, node string) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if mv.m == nil || len(mv.m) >= maxMoved {
		mv.m = map[string]string{}
	}
	mv.m[id] = node
	mv.n.Store(int64(len(mv.m)))
}

func (mv *moved) drop(id string) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	delete(mv.m, id)
	mv.n.Store(int64(len(mv.m)))
}

// byName is the live node named name.
func (rt *Router) byName(name string) *node {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	for _, n := range rt.table.nodes {
		if n.Name == name && n.State != api.NodeLost {
			return n
		}
	}
	return nil
}

// movedNode is the live node the cache says archived sandbox id moved
// to, or nil.
func (rt *Router) movedNode(id string) *node {
	name, ok := rt.movedTo.get(id)
	if !ok {
		return nil
	}
	if n := rt.byName(name); n != nil {
		return n
	}
	rt.movedTo.drop(id)
	return nil
}

// errNotArchived: the archive knows nothing of the id.
var errNotArchived = errors.New("not archived")

// findArchived reads sandbox id's record for a call the tag's node
// cannot take (tagErr says why): the live node it names, or the record
// of an archived sandbox no live node holds (nil node, nil error).
func (rt *Router) findArchived(ctx context.Context, id string, tagErr error) (*node, archive.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, archiveLookup)
	rec, err := rt.cfg.Archive.Get(ctx, id)
	cancel()
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return nil, rec, errNotArchived
	case err != nil:
		return nil, rec, errdefs.New(errdefs.ErrUnavailable, "%v; and the archive, which may hold it, did not answer: %v", tagErr, err)
	}
	if n := rt.byName(rec.Node); n != nil {
		rt.movedTo.set(id, n.Name)
		return n, rec, nil
	}
	if rec.Disk == nil {
		return nil, rec, errdefs.New(errdefs.ErrUnavailable, "sandbox %s was restored on node %s, which is gone: %v", id, rec.Node, tagErr)
	}
	return nil, rec, nil
}

// archivedOwner is owner for an id whose tag's node cannot take it
// (tagErr): the node the archive names, or an error saying what to do.
func (rt *Router) archivedOwner(ctx context.Context, id string, tagErr error) (*node, error) {
	n, _, err := rt.findArchived(ctx, id, tagErr)
	switch {
	case errors.Is(err, errNotArchived):
		return nil, tagErr
	case err != nil:
		return nil, err
	case n == nil:
		return nil, errdefs.Conflict("sandbox %s is archived and its node is gone: resume it to bring it back on another node", id)
	}
	return n, nil
}

// routeArchived serves a call for sandbox id that the tag's node cannot
// take (tagErr says why) from what the archive says of it; it reports
// false, having answered nothing, when the archive knows nothing of it.
func (rt *Router) routeArchived(w http.ResponseWriter, r *http.Request, id string, tagErr error) bool {
	n, rec, err := rt.findArchived(r.Context(), id, tagErr)
	switch {
	case errors.Is(err, errNotArchived):
		return false
	case err != nil:
		server.WriteError(w, r, rt.log, err)
	case n != nil:
		n.serve(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes/"+id+"/resume":
		rt.restoreArchived(w, r, id, rec)
	default:
		server.WriteError(w, r, rt.log, errdefs.Conflict("sandbox %s is archived and its node %s is gone: resume it to bring it back on another node", id, rec.Node))
	}
	return true
}

// restoreArchived places the resume of an archived sandbox as a create
// is placed: the node chosen takes it in from the archive.
func (rt *Router) restoreArchived(w http.ResponseWriter, r *http.Request, id string, rec archive.Record) {
	var sb api.Sandbox
	if err := json.Unmarshal(rec.Sandbox, &sb); err != nil {
		server.WriteError(w, r, rt.log, errdefs.New(errdefs.ErrInvalid, "the archived record of %s is corrupt", id))
		return
	}
	d, err := rt.demandOf(sb.Resources, nil, "", sb.Image)
	if err != nil {
		server.WriteError(w, r, rt.log, err)
		return
	}
	rt.place(w, r, d, func(err error) { server.WriteError(w, r, rt.log, err) }, func(n *node) (*http.Response, error) {
		resp, err := n.post(r, "/v1/sandboxes/"+id+"/resume", nil)
		if err == nil && resp.StatusCode == http.StatusOK {
			rt.movedTo.set(id, n.Name)
		}
		return resp, err
	})
}

// A node that held a stub of an archived sandbox another node took in
// answers calls for it with a MovedError (404 and errdefs.MovedHeader):
// the gateway follows it once, and caches where the sandbox went.

// movedError is a node's answer naming where a sandbox went.
type movedError struct{ node string }

func (e *movedError) Error() string { return "moved to node " + e.node }

// movedAnswer turns a node's MovedError answer into a movedError, for the
// proxy's error handler to follow.
func movedAnswer(resp *http.Response) error {
	if resp.StatusCode != http.StatusNotFound {
		return nil
	}
	if to := resp.Header.Get(errdefs.MovedHeader); to != "" {
		return &movedError{node: to}
	}
	return nil
}

// followedKey marks a request the gateway followed to another node.
type followedKey struct{}

// followMoved serves a call that the node of the id's tag answered with
// "moved to node": there, if that node is live and the call has no body
// the first try consumed; else from the archive, or with an error saying
// to try again.
func (rt *Router) followMoved(w http.ResponseWriter, r *http.Request, to string) {
	id, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"), "/")
	if !strings.HasPrefix(r.URL.Path, "/v1/sandboxes/") || r.Context().Value(followedKey{}) != nil {
		server.WriteError(w, r, rt.log, &errdefs.MovedError{ID: id, Node: to})
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), followedKey{}, true))
	n := rt.byName(to)
	replayable := r.Body == nil || r.Body == http.NoBody
	switch {
	case n != nil && replayable:
		rt.movedTo.set(id, n.Name)
		n.serve(w, r)
	case n != nil:
		rt.movedTo.set(id, n.Name)
		server.WriteError(w, r, rt.log, errdefs.New(errdefs.ErrUnavailable,
			"sandbox %s moved to node %s (restored there from the archive): try the call again", id, to))
	case rt.cfg.Archive != nil && replayable:
		gone := errdefs.New(errdefs.ErrUnavailable, "sandbox %s moved to node %s, which is not in the cluster", id, to)
		if !rt.routeArchived(w, r, id, gone) {
			server.WriteError(w, r, rt.log, gone)
		}
	default:
		server.WriteError(w, r, rt.log, errdefs.New(errdefs.ErrUnavailable, "sandbox %s moved to node %s, which is not in the cluster", id, to))
	}
}
