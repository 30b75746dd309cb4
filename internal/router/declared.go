package router

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/egress"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reconcile"
	"github.com/paddock-dev/paddock/internal/server"
)

// SetPresets gives the gateway the cluster's PolicyPresets (a watch's
// latest list), which a create may name among its policy's presets.
// Without it only the built-in presets are known.
func (rt *Router) SetPresets(presets func() []*cluster.PolicyPreset) {
	rt.mu.Lock()
	rt.presets = presets
	rt.mu.Unlock()
}

// expandPresets puts the PolicyPresets a create names into its policy,
// and returns the body to pass on (body itself when it names none).
func (rt *Router) expandPresets(req *api.CreateRequest, body []byte) ([]byte, error) {
	if req.Policy == nil || len(req.Policy.Presets) == 0 {
		return body, nil
	}
	rt.mu.RLock()
	presets := rt.presets
	rt.mu.RUnlock()
	var list []*cluster.PolicyPreset
	if presets != nil {
		list = presets()
	}
	builtin := egress.Presets()
	custom := false
	for _, p := range req.Policy.Presets {
		if _, ok := builtin[p]; !ok {
			custom = true
		}
	}
	if !custom {
		return body, nil
	}
	p, err := reconcile.ExpandPresets(req.Policy, list)
	if err != nil {
		return nil, err
	}
	req.Policy = p
	return json.Marshal(req)
}

// declared is the gateway's handler of the routes of what a cluster
// declares as objects (templates, warm pools, secrets) and of its
// policy presets: reads gathered from the nodes, writes refused with
// the object to declare instead.
func (rt *Router) declared(method, path string) (http.HandlerFunc, bool) {
	refuse := func(what string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			server.WriteError(w, r, rt.log, &server.HTTPError{Code: http.StatusMethodNotAllowed, Err: errdefs.ErrInvalid,
				Msg: method + " " + path + " is not served by a cluster's gateway: " + what})
		}
	}
	switch {
	case path == "/v1/templates" && method == http.MethodGet:
		return rt.gatherTemplates(""), true
	case strings.HasPrefix(path, "/v1/templates/") && method == http.MethodGet:
		return rt.gatherTemplates(strings.TrimPrefix(path, "/v1/templates/")), true
	case path == "/v1/templates" || strings.HasPrefix(path, "/v1/templates/"):
		return refuse("declare a SandboxTemplate (deploy/crd-sandboxtemplate.yaml); every node that needs it builds it"), true
	case path == "/v1/pools" && method == http.MethodGet:
		return rt.gatherPools, true
	case path == "/v1/pools":
		return refuse("declare a SandboxWarmPool (deploy/crd-sandboxwarmpool.yaml); the nodes share it out"), true
	case path == "/v1/secrets" && method == http.MethodGet:
		return rt.gatherSecrets, true
	case path == "/v1/secrets" || strings.HasPrefix(path, "/v1/secrets/"):
		return refuse("put the secret in a Kubernetes Secret of the " + cluster.SecretsNamespace + " namespace; every node takes each of its keys as a secret"), true
	case path == "/v1/policies" && method == http.MethodGet:
		return rt.listPresets, true
	}
	return nil, false
}

// gatherTemplates answers GET /v1/templates (name "") or
// /v1/templates/{name}: the nodes' templates, one per name (the first
// node's, by name), with the warm guests of every node counted.
func (rt *Router) gatherTemplates(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		parts, ok := rt.gatherJSON(w, r, "/v1/templates", func(b []byte) (any, error) {
			var list []api.Template
			err := json.Unmarshal(b, &list)
			return list, err
		})
		if !ok {
			return
		}
		byName := map[string]*api.Template{}
		var names []string
		for _, part := range parts {
			for _, t := range part.([]api.Template) {
				if have := byName[t.Name]; have != nil {
					have.Warm += t.Warm
					have.WarmReady += t.WarmReady
					continue
				}
				byName[t.Name] = &t
				names = append(names, t.Name)
			}
		}
		if name != "" {
			t := byName[name]
			if t == nil {
				server.WriteError(w, r, rt.log, errdefs.NotFound("template", name))
				return
			}
			writeJSON(w, http.StatusOK, t)
			return
		}
		sort.Strings(names)
		out := make([]api.Template, 0, len(names))
		for _, n := range names {
			out = append(out, *byName[n])
		}
		writeJSON(w, http.StatusOK, out)
	}
}

// gatherPools answers GET /v1/pools: every node's pools, summed.
func (rt *Router) gatherPools(w http.ResponseWriter, r *http.Request) {
	parts, ok := rt.gatherJSON(w, r, "/v1/pools", func(b []byte) (any, error) {
		var p api.Pools
		err := json.Unmarshal(b, &p)
		return p, err
	})
	if !ok {
		return
	}
	out := api.Pools{Ready: map[string]int{}, Target: map[string]int{}}
	for _, part := range parts {
		p := part.(api.Pools)
		for k, v := range p.Ready {
			out.Ready[k] += v
		}
		for k, v := range p.Target {
			out.Target[k] += v
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// gatherSecrets answers GET /v1/secrets: the names any node holds.
func (rt *Router) gatherSecrets(w http.ResponseWriter, r *http.Request) {
	parts, ok := rt.gatherJSON(w, r, "/v1/secrets", func(b []byte) (any, error) {
		var list []api.Secret
		err := json.Unmarshal(b, &list)
		return list, err
	})
	if !ok {
		return
	}
	seen := map[string]bool{}
	out := []api.Secret{}
	for _, part := range parts {
		for _, s := range part.([]api.Secret) {
			if !seen[s.Name] {
				seen[s.Name] = true
				out = append(out, s)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	writeJSON(w, http.StatusOK, out)
}

// listPresets answers GET /v1/policies: the built-in presets and the
// cluster's PolicyPresets, each with what is wrong with it, if anything.
func (rt *Router) listPresets(w http.ResponseWriter, r *http.Request) {
	var out []api.PolicyPreset
	for name, hosts := range egress.Presets() {
		p := api.Policy{}
		for _, h := range hosts {
			p.Allow = append(p.Allow, api.PolicyRule{Match: h})
		}
		out = append(out, api.PolicyPreset{Name: name, BuiltIn: true, Policy: p})
	}
	rt.mu.RLock()
	presets := rt.presets
	rt.mu.RUnlock()
	if presets != nil {
		for _, pp := range presets() {
			ap := api.PolicyPreset{Name: pp.Name, Policy: *pp.Spec.Clone()}
			if err := reconcile.CheckPreset(pp); err != nil {
				ap.Error = err.Error()
			}
			out = append(out, ap)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	writeJSON(w, http.StatusOK, out)
}

// gatherJSON fans a GET of path (with r's query) out to the nodes and
// decodes each good answer with decode. A node that does not answer, or
// answers with something else, is named in MissingNodesHeader and the
// others' parts still come; an error every node would answer (a bad
// query) goes to the client as the first node answered it. It answers
// the client itself (and reports false) when it cannot go on.
func (rt *Router) gatherJSON(w http.ResponseWriter, r *http.Request, path string, decode func([]byte) (any, error)) ([]any, bool) {
	fr := r
	if path != r.URL.Path {
		fr = r.Clone(r.Context())
		fr.URL.Path, fr.URL.RawQuery = path, ""
	}
	answers, missing := rt.fanOut(fr)
	bodies, missing, failed := rt.sortAnswers(answers, missing)
	if failed != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(failed.status)
		w.Write(failed.body)
		return nil, false
	}
	var parts []any
	for _, a := range bodies {
		v, err := decode(a.body)
		if err != nil {
			rt.log.Warn("node answered with something else", "node", a.n.Name, "path", path, "err", err)
			missing = append(missing, a.n.Name)
			continue
		}
		parts = append(parts, v)
	}
	if len(parts) == 0 && len(missing) > 0 {
		server.WriteError(w, r, rt.log, errdefs.New(errdefs.ErrUnavailable, "no node answered (%s)", strings.Join(missing, ", ")))
		return nil, false
	}
	if len(missing) > 0 {
		w.Header().Set(MissingNodesHeader, strings.Join(missing, ", "))
	}
	return parts, true
}
