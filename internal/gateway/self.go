package gateway

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"time"

	"paddock/internal/egress"
)

// selfReadme is /run/paddock/README in every sandbox.
const selfReadme = `This directory is paddock telling this sandbox about itself. It is
read-only and kept current (about once a second).

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
		v["policy"] = egress.Policy{}
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
// Each file is written only when its content changed: self.json holds the
// usage, new every tick, but the README, the policy and the denials seldom
// change, and rewriting all four each second for every running sandbox
// was four file replacements per sandbox per second.
func (g *Gateway) refreshSelf(every time.Duration) {
	defer g.wg.Done()
	written := map[string]map[string][]byte{} // sandbox → file → content
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		seen := map[string]bool{}
		for id := range g.net.Links() {
			seen[id] = true
			if written[id] == nil {
				written[id] = map[string][]byte{}
			}
			g.writeSelf(id, g.selfView(id), written[id])
		}
		for id := range written {
			if !seen[id] {
				delete(written, id)
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

// writeSelf writes the files of sandbox id's self view whose content is
// not what written says they hold, and records what it wrote.
func (g *Gateway) writeSelf(id string, v map[string]any, written map[string][]byte) {
	dir := filepath.Join(g.dir(id), "self")
	for name, x := range map[string]any{"self.json": v, "policy.json": v["policy"], "denials.json": v["denials"]} {
		b, _ := json.MarshalIndent(x, "", "  ")
		g.writeSelfFile(dir, name, append(b, '\n'), written)
	}
	g.writeSelfFile(dir, "README", []byte(selfReadme+"\n"), written)
}

func (g *Gateway) writeSelfFile(dir, name string, b []byte, written map[string][]byte) {
	if bytes.Equal(b, written[name]) {
		return
	}
	if err := writeFile(filepath.Join(dir, name), b, 0o644); err != nil {
		delete(written, name) // try again next time
		return
	}
	written[name] = b
}
