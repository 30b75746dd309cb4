package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/egress"
)

// selfReadme is /run/paddock/README in every sandbox.
const selfReadme = `This directory is paddock telling this sandbox about itself. It is
read-only and kept current: about once a second, and about every 10 seconds
while nothing but the time of self.json's usage sample would change.

  self.json     everything below in one document
  policy.json   what this sandbox may reach on the network
  denials.json  recent connections and requests the policy refused, newest
                last, each with the reason and the rule that would allow it
                ("suggest")

The same is served at http://paddock.internal/v1/self (and /v1/self/policy,
/v1/self/denials) to this sandbox only, with no credential.

When a connection fails, look at denials.json: a refused HTTP request got a
403 whose body names the rule to add; a refused TCP connect was reset at
once; a refused DNS name got REFUSED.

To ask a person for a host, POST to http://paddock.internal/v1/self/requests
  {"host": "api.example.com", "reason": "why you need it"}
(a name, or an address, with an optional :PORT). The answer is the
request; GET http://paddock.internal/v1/self/requests/ID until its "state"
is "approved" (then retry) or "denied". A policy whose mode is "ask" files
a request for each refused host by itself.
`

func denials(evs []egress.Event) []api.Denial {
	out := make([]api.Denial, 0, len(evs))
	for _, e := range evs {
		out = append(out, api.Denial{Time: e.Time, Kind: string(e.Kind), Host: e.Host, IP: e.IP, Port: e.Port,
			Method: e.Method, Path: e.Path, Reason: e.Reason, Rule: e.Rule, Suggest: e.Suggest})
	}
	return out
}

// selfView is what sandbox id may know about itself: the hub's part (if
// it knows the sandbox), its policy and its denials.
func (g *Gateway) selfView(id string) api.Self {
	g.mu.Lock()
	selfFn := g.selfFn
	g.mu.Unlock()
	var v api.Self
	if selfFn != nil {
		if hv, err := selfFn(id); err == nil {
			v = hv
		}
	}
	v.Sandbox = id
	if p, ok := g.eng.Policy(id); ok {
		v.Policy = *p
	}
	v.Denials = denials(g.Denials(id))
	return v
}

// selfDocs are the JSON documents http://paddock.internal serves, by path;
// api/openapi.yaml documents each.
var selfDocs = map[string]func(api.Self) any{
	"/v1/self":         func(v api.Self) any { return v },
	"/v1/self/policy":  func(v api.Self) any { return v.Policy },
	"/v1/self/denials": func(v api.Self) any { return v.Denials },
}

// SelfPaths lists the paths http://paddock.internal serves a sandbox:
// the JSON documents and its requests.
func SelfPaths() []string {
	return slices.Sorted(slices.Values(append(slices.Collect(maps.Keys(selfDocs)), selfRequests, selfRequests+"/{id}")))
}

func (g *Gateway) serveSelf(w http.ResponseWriter, r *http.Request) {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	a, err := netip.ParseAddr(host)
	id, ok := "", false
	if err == nil {
		id, ok = g.lookup(a.Unmap())
	}
	if !ok {
		http.Error(w, "not a sandbox", http.StatusForbidden)
		return
	}
	if g.serveRequests(w, r, id) {
		return
	}
	if r.URL.Path == "/" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte(selfReadme))
		return
	}
	doc, ok := selfDocs[strings.TrimSuffix(r.URL.Path, "/")]
	if !ok {
		http.Error(w, "not found: try /v1/self", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(doc(g.selfView(id)))
}

// refreshSelf keeps every attached sandbox's /run/paddock tree current.
// Each file is written only when its content changed: the README, the
// policy and the denials seldom do. self.json's usage sample is new every
// tick, but an idle sandbox's differs only in its time: such a file is
// replaced every selfStale, not every second (http://paddock.internal/v1/self
// is always current). Before, every running sandbox cost four file
// replacements a second.
func (g *Gateway) refreshSelf(every time.Duration) {
	defer g.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	all := true
	for {
		dirty := g.takeDirty()
		if all {
			for id := range g.net.Links() {
				g.refreshOne(id)
			}
		} else {
			for id := range dirty {
				g.refreshOne(id)
			}
		}
		select {
		case <-g.stop:
			return
		case <-t.C:
			all = true
		case <-g.wake:
			all = false
		}
	}
}

// takeDirty returns the sandboxes poked since it was last called.
func (g *Gateway) takeDirty() map[string]struct{} {
	g.dirtyMu.Lock()
	defer g.dirtyMu.Unlock()
	if len(g.dirty) == 0 {
		return nil
	}
	d := g.dirty
	g.dirty = nil
	return d
}

// refreshOne brings sandbox id's self tree up to date, if Attach made it
// and Forget has not taken it: the writer never makes a directory.
func (g *Gateway) refreshOne(id string) {
	v := g.selfView(id)
	g.selfMu.Lock()
	defer g.selfMu.Unlock()
	if tree := g.selfTrees[id]; tree != nil {
		g.writeSelf(id, v, tree, time.Now())
	}
}

// selfDefaults are the files of a new self tree: the README, the same
// for every sandbox, and the policy and denials of a sandbox that has
// none yet. They are written once under Dir/self and linked into each
// tree, which costs no inode (making one costs 0.2-0.4 ms on this host's
// ext4); the writer replaces a link like any file once its content
// changes. Made once (marshalled again for each sandbox, they were half
// the cost of linking them: issue 21); read-only.
var selfDefaults = sync.OnceValue(func() map[string][]byte {
	files := selfDocFiles(api.Self{Denials: []api.Denial{}})
	files["README"] = []byte(selfReadme + "\n")
	return files
})

// writeSelfDefaults writes Dir/self.
func (g *Gateway) writeSelfDefaults() error {
	for name, b := range selfDefaults() {
		if err := durable.Replace(filepath.Join(g.cfg.Dir, "self", name), b, 0o644); err != nil {
			return fmt.Errorf("writing the self tree's defaults: %w", err)
		}
	}
	return nil
}

// linkSelfDefaults links the defaults into the self tree dir and returns
// the writer's record of it: a file that was there already (a sandbox
// attached again) is left as it is, to be written at the next refresh.
func (g *Gateway) linkSelfDefaults(dir string) (*selfTree, error) {
	tree := &selfTree{written: map[string]uint64{}}
	for name, b := range selfDefaults() {
		err := os.Link(filepath.Join(g.cfg.Dir, "self", name), filepath.Join(dir, name))
		switch {
		case err == nil:
			tree.written[name] = selfHash(b)
		case !errors.Is(err, fs.ErrExist):
			return nil, fmt.Errorf("linking the self tree's %s: %w", name, err)
		}
	}
	return tree, nil
}

// selfStale is how long self.json may keep a usage sample whose newer one
// differs only in its time.
const selfStale = 10 * time.Second

// selfTree is what refreshSelf last wrote to a sandbox's self tree:
// hashes of the contents (selfHash), not the contents, which were 4 KiB
// the daemon held per sandbox for nothing but a comparison (issue 21).
type selfTree struct {
	written map[string]uint64 // file → its content's hash
	// key is the hash of self.json's content with the usage sample's time
	// left out, as of its last write at keyAt.
	key   uint64
	keyAt time.Time
	// ended says the sandbox's processes have all ended (Recycle): its
	// directory may become a spare.
	ended bool
}

// selfSeed seeds selfHash: a sandbox, which chooses what it connects to
// and so part of denials.json, cannot know it, so cannot make two
// contents collide.
var selfSeed = maphash.MakeSeed()

func selfHash(b []byte) uint64 { return maphash.Bytes(selfSeed, b) }

// writeSelf writes the files of sandbox id's self view v that changed
// since tree's last write, as of now, and records what it wrote.
func (g *Gateway) writeSelf(id string, v api.Self, tree *selfTree, now time.Time) {
	dir := filepath.Join(g.dir(id), "self")
	for name, b := range selfDocFiles(v) {
		g.writeSelfFile(dir, name, b, tree.written)
	}
	keyed := v
	if v.Usage != nil {
		u := *v.Usage
		u.Time = time.Time{}
		keyed.Usage = &u
	}
	kb, _ := json.Marshal(keyed)
	key := selfHash(kb)
	if key == tree.key && now.Sub(tree.keyAt) < selfStale {
		return
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	if g.writeSelfFile(dir, "self.json", append(b, '\n'), tree.written) {
		tree.key, tree.keyAt = key, now
	}
}

// selfDocFiles are the self tree's files of v but self.json.
func selfDocFiles(v api.Self) map[string][]byte {
	out := map[string][]byte{}
	for name, x := range map[string]any{"policy.json": v.Policy, "denials.json": v.Denials} {
		b, _ := json.MarshalIndent(x, "", "  ")
		out[name] = append(b, '\n')
	}
	return out
}

// writeSelfFile writes b to dir/name unless written says it holds b
// already, and reports whether the file holds b now.
func (g *Gateway) writeSelfFile(dir, name string, b []byte, written map[string]uint64) bool {
	h := selfHash(b)
	if w, ok := written[name]; ok && w == h {
		return true
	}
	if err := swapIn(dir, name, b); err != nil {
		delete(written, name) // try again next time
		return false
	}
	written[name] = h
	return true
}
