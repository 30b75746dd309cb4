package gateway

import (
	"bytes"
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
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
once; a refused DNS name got REFUSED. Ask whoever runs you to add the rule.
`

// denial is a refusal as the agent sees it.
type denial struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Host    string    `json:"host,omitempty"`
	IP      string    `json:"ip,omitempty"`
	Port    uint16    `json:"port,omitempty"`
	Method  string    `json:"method,omitempty"`
	Path    string    `json:"path,omitempty"`
	Reason  string    `json:"reason"`
	Rule    string    `json:"rule,omitempty"`
	Suggest string    `json:"suggest,omitempty"`
}

func denials(evs []egress.Event) []denial {
	out := make([]denial, 0, len(evs))
	for _, e := range evs {
		out = append(out, denial{Time: e.Time, Kind: string(e.Kind), Host: e.Host, IP: e.IP, Port: e.Port,
			Method: e.Method, Path: e.Path, Reason: e.Reason, Rule: e.Rule, Suggest: e.Suggest})
	}
	return out
}

// selfView is what sandbox id may know about itself.
func (g *Gateway) selfView(id string) map[string]any {
	v := map[string]any{}
	g.mu.Lock()
	selfFn := g.selfFn
	g.mu.Unlock()
	if selfFn != nil {
		if more, err := selfFn(id); err == nil {
			for k, x := range more {
				v[k] = x
			}
		}
	}
	v["sandbox"] = id
	if p, ok := g.eng.Policy(id); ok {
		v["policy"] = p
	} else {
		v["policy"] = api.Policy{}
	}
	v["denials"] = denials(g.Denials(id))
	return v
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
	v := g.selfView(id)
	var body any
	switch r.URL.Path {
	case "/v1/self", "/v1/self/":
		body = v
	case "/v1/self/policy":
		body = v["policy"]
	case "/v1/self/denials":
		body = v["denials"]
	case "/":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte(selfReadme))
		return
	default:
		http.Error(w, "not found: try /v1/self", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(body)
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
	trees := map[string]*selfTree{}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		seen := map[string]bool{}
		for id := range g.net.Links() {
			seen[id] = true
			if trees[id] == nil {
				trees[id] = &selfTree{written: map[string][]byte{}}
			}
			g.writeSelf(id, g.selfView(id), trees[id], time.Now())
		}
		for id := range trees {
			if !seen[id] {
				delete(trees, id)
			}
		}
		select {
		case <-g.stop:
			return
		case <-t.C:
		case <-g.wake:
		}
	}
}

// selfStale is how long self.json may keep a usage sample whose newer one
// differs only in its time.
const selfStale = 10 * time.Second

// selfTree is what refreshSelf last wrote to a sandbox's self tree.
type selfTree struct {
	written map[string][]byte // file → content
	// key is self.json's content with the usage sample's time left out,
	// as of its last write at keyAt.
	key   []byte
	keyAt time.Time
}

// writeSelf writes the files of sandbox id's self view v that changed
// since tree's last write, as of now, and records what it wrote.
func (g *Gateway) writeSelf(id string, v map[string]any, tree *selfTree, now time.Time) {
	dir := filepath.Join(g.dir(id), "self")
	g.writeSelfFile(dir, "README", []byte(selfReadme+"\n"), tree.written)
	for name, x := range map[string]any{"policy.json": v["policy"], "denials.json": v["denials"]} {
		b, _ := json.MarshalIndent(x, "", "  ")
		g.writeSelfFile(dir, name, append(b, '\n'), tree.written)
	}
	keyed := v
	if u, ok := v["usage"].(api.Sample); ok {
		keyed = maps.Clone(v)
		u.Time = time.Time{}
		keyed["usage"] = u
	}
	key, _ := json.Marshal(keyed)
	if bytes.Equal(key, tree.key) && now.Sub(tree.keyAt) < selfStale {
		return
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	if g.writeSelfFile(dir, "self.json", append(b, '\n'), tree.written) {
		tree.key, tree.keyAt = key, now
	}
}

// writeSelfFile writes b to dir/name unless written says it holds b
// already, and reports whether the file holds b now.
func (g *Gateway) writeSelfFile(dir, name string, b []byte, written map[string][]byte) bool {
	if bytes.Equal(b, written[name]) {
		return true
	}
	if err := durable.Replace(filepath.Join(dir, name), b, 0o644); err != nil {
		delete(written, name) // try again next time
		return false
	}
	written[name] = b
	return true
}
