package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/server"
)

// placedCount is what the gateway placed on one node since the table last
// changed (guarded by Router.mu).
type placedCount struct {
	res   api.NodeResources
	pools map[string]int // warm guests it expects the creates took
}

// add is a node's Allocated with what the gateway placed on it since.
func (pc *placedCount) add(a api.NodeResources) api.NodeResources {
	a.CPUs += pc.res.CPUs
	a.MemoryBytes += pc.res.MemoryBytes
	a.DiskBytes += pc.res.DiskBytes
	a.Sandboxes += pc.res.Sandboxes
	return a
}

// demand is what a create asks of a node for placing it.
type demand struct {
	res      api.NodeResources
	pools    []string          // the warm pools that could serve it
	selector map[string]string // labels the node must have
	only     string            // the node that must take it (its snapshot's), by name
}

// create places a new sandbox (POST /v1/sandboxes): it picks a node and
// passes the request on as it came; a node that refuses it for want of
// room (503: admission, a full disk) passes it to the next best node.
func (rt *Router) create(w http.ResponseWriter, r *http.Request) {
	fail := func(err error) { server.WriteError(w, r, rt.log, err) }
	body, err := readBody(w, r)
	if err != nil {
		fail(err)
		return
	}
	var req api.CreateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		fail(reqcheck.DecodeError(err))
		return
	}
	if body, err = rt.expandPresets(&req, body); err != nil {
		fail(err)
		return
	}
	d, err := rt.demandOf(req.Resources, req.NodeSelector, req.From, req.Image)
	if err != nil {
		fail(err)
		return
	}
	rt.place(w, r, d, fail, func(n *node) (*http.Response, error) { return n.post(r, "/v1/sandboxes", body) })
}

// readBody reads a create's body, at most reqcheck.MaxBody bytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, reqcheck.MaxBody))
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		err = fmt.Errorf("%w: request body exceeds %d bytes", errdefs.ErrTooLarge, mbe.Limit)
	}
	return body, err
}

// place sends a create to the node pick chooses for d, and on to the
// next while nodes refuse it for want of room or do not answer; the first
// other answer goes to the client. fail answers an error in the API's
// own form.
func (rt *Router) place(w http.ResponseWriter, r *http.Request, d demand, fail func(error), send func(*node) (*http.Response, error)) {
	var tried map[string]bool // made at a first refusal: most creates go to the first node
	var refusals []string
	for {
		n, warm, err := rt.pick(d, tried)
		if err != nil {
			if len(refusals) > 0 {
				err = errdefs.New(errdefs.ErrUnavailable, "no node took the sandbox: %s", strings.Join(refusals, "; "))
			}
			fail(err)
			return
		}
		resp, err := send(n)
		if err != nil || resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusInsufficientStorage {
			if tried == nil {
				tried = map[string]bool{}
			}
			tried[n.Name] = true
		}
		if err != nil {
			rt.unplace(n, d, warm)
			if r.Context().Err() != nil {
				return
			}
			refusals = append(refusals, fmt.Sprintf("node %s did not answer (%v)", n.Name, err))
			continue
		}
		if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusInsufficientStorage {
			rt.unplace(n, d, warm)
			refusals = append(refusals, fmt.Sprintf("node %s: %s", n.Name, errorMessage(resp)))
			continue
		}
		if resp.StatusCode >= 300 {
			rt.unplace(n, d, warm)
		}
		copyResponse(w, resp)
		return
	}
}

// demandOf is what a create asks of a node. Resources it leaves at zero
// count as the gateway's defaults (the nodes'). from is a snapshot id (the
// node that holds it must take the sandbox), a template or an image name.
func (rt *Router) demandOf(res api.Resources, selector map[string]string, from, image string) (demand, error) {
	def := rt.cfg.Defaults
	pick := func(v, d float64) float64 {
		if v > 0 {
			return v
		}
		return d
	}
	d := demand{selector: selector}
	d.res.CPUs = pick(res.CPUs, def.CPUs)
	d.res.MemoryBytes = int64(pick(float64(res.MemoryBytes), float64(def.MemoryBytes)))
	d.res.DiskBytes = int64(pick(float64(res.DiskBytes), float64(def.DiskBytes)))
	d.res.Sandboxes = 1
	switch {
	case strings.HasPrefix(from, snapshotPrefix):
		// A snapshot lives on the node that took it.
		n, err := rt.owner(from, strings.TrimPrefix(from, snapshotPrefix))
		if err != nil {
			return d, err
		}
		d.only = n.Name
	case from != "":
		// A template's name, or an image's.
		d.pools = []string{"template:" + from, "image:" + from}
	case image != "":
		d.pools = []string{"image:" + image}
	default:
		d.pools = []string{"image:host"}
	}
	return d, nil
}

// pick chooses the node for d among those not tried, and counts d as
// placed on it (unplace takes it back if the node refuses): ready nodes
// with the selected labels and room for it, those with a warm guest of
// its image or template first, then the emptiest (spread) or the fullest
// (pack). With none, the error names what is missing.
func (rt *Router) pick(d demand, tried map[string]bool) (_ *node, warm string, _ error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	// One pass over the packed candidates, keeping the best so far: no
	// allocation and no lookup by name on the way.
	var best *candidate
	var bestWarm string
	var bestLoad float64
	var ready, labelled int
	var short map[string]int // nodes without room, by resource
	cands := rt.table.cands
	for i := range cands {
		c := &cands[i]
		if !c.ready || (d.only != "" && c.n.Name != d.only) || (len(tried) > 0 && tried[c.n.Name]) {
			continue
		}
		ready++
		if len(d.selector) > 0 && !hasLabels(c.n.Labels, d.selector) {
			continue
		}
		labelled++
		used := c.placed.add(c.allocated)
		if lacks := lacking(c.capacity, used, d.res); len(lacks) > 0 {
			if short == nil {
				short = map[string]int{}
			}
			for _, res := range lacks {
				short[res]++
			}
			continue
		}
		w, l := warmPool(c.pools, c.placed.pools, d.pools), load(c.capacity, used)
		if best == nil || better(w != "", l, bestWarm != "", bestLoad, rt.cfg.Pack) {
			best, bestWarm, bestLoad = c, w, l
		}
	}
	if best == nil {
		return nil, "", rt.nowhere(d, tried, ready, labelled, short)
	}
	pc := best.placed
	pc.res = (&placedCount{res: d.res}).add(pc.res)
	if bestWarm != "" {
		pc.pools[bestWarm]++
	}
	return best.n, bestWarm, nil
}

// better reports whether a node (with a warm guest or not, at load l)
// beats the best so far: a warm guest first, then the emptiest (or, with
// pack, the fullest); a tie keeps the earlier node (by name).
func better(warm bool, l float64, bestWarm bool, bestLoad float64, pack bool) bool {
	if warm != bestWarm {
		return warm
	}
	if pack {
		return l > bestLoad
	}
	return l < bestLoad
}

// warmPool is the first of pools in which a node has a warm guest left
// (ready, its pools with guests), after those the gateway's creates since
// the table changed took.
func warmPool(ready []poolCount, taken map[string]int, pools []string) string {
	for _, p := range pools {
		for _, r := range ready {
			if r.pool == p && r.n > 0 && (len(taken) == 0 || r.n-taken[p] > 0) {
				return p
			}
		}
	}
	return ""
}

// unplace takes back what pick counted on n for d (and the guest of pool
// warm).
func (rt *Router) unplace(n *node, d demand, warm string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	pc := rt.placed[n.Name]
	if pc == nil {
		return // gone from the table meanwhile
	}
	// Never below zero: the table may have changed meanwhile, and the
	// count started again from the nodes' own allocation.
	pc.res.CPUs = max(0, pc.res.CPUs-d.res.CPUs)
	pc.res.MemoryBytes = max(0, pc.res.MemoryBytes-d.res.MemoryBytes)
	pc.res.DiskBytes = max(0, pc.res.DiskBytes-d.res.DiskBytes)
	pc.res.Sandboxes = max(0, pc.res.Sandboxes-d.res.Sandboxes)
	if pc.pools[warm] > 0 {
		pc.pools[warm]--
	}
}

// nowhere is the error of a create no node can take.
func (rt *Router) nowhere(d demand, tried map[string]bool, ready, labelled int, short map[string]int) error {
	switch {
	case ready == 0 && d.only != "":
		return errdefs.New(errdefs.ErrUnavailable, "node %s, which holds the snapshot, is not ready for creates", d.only)
	case ready == 0 && len(tried) == 0:
		return errdefs.New(errdefs.ErrUnavailable, "no node is ready for creates (%s)", rt.table.states())
	case ready == 0:
		return errdefs.New(errdefs.ErrUnavailable, "every ready node refused the sandbox")
	case labelled == 0:
		return errdefs.New(errdefs.ErrUnavailable, "no ready node has the labels %s", formatLabels(d.selector))
	}
	names := make([]string, 0, len(short))
	for res := range short {
		names = append(names, res)
	}
	sort.Strings(names)
	return errdefs.New(errdefs.ErrUnavailable, "no node has room for the sandbox: %s (%s requested) full on every node that could take it",
		strings.Join(names, ", "), formatDemand(d.res))
}

// lacking names the resources of which a node with capacity cap, of which
// used is taken, has less free than want. A zero capacity is not known
// and bounds nothing.
func lacking(capacity, used, want api.NodeResources) []string {
	var out []string
	if capacity.CPUs > 0 && used.CPUs+want.CPUs > capacity.CPUs {
		out = append(out, "cpus")
	}
	if capacity.MemoryBytes > 0 && used.MemoryBytes+want.MemoryBytes > capacity.MemoryBytes {
		out = append(out, "memory")
	}
	if capacity.DiskBytes > 0 && used.DiskBytes+want.DiskBytes > capacity.DiskBytes {
		out = append(out, "disk")
	}
	if capacity.Sandboxes > 0 && used.Sandboxes+want.Sandboxes > capacity.Sandboxes {
		out = append(out, "sandboxes")
	}
	return out
}

// load is how full a node is: its fullest known resource's share, or,
// when it publishes no capacity, its sandboxes (so creates still spread).
func load(capacity, used api.NodeResources) float64 {
	shares := []struct{ used, cap float64 }{
		{used.CPUs, capacity.CPUs},
		{float64(used.MemoryBytes), float64(capacity.MemoryBytes)},
		{float64(used.DiskBytes), float64(capacity.DiskBytes)},
		{float64(used.Sandboxes), float64(capacity.Sandboxes)},
	}
	known, l := false, 0.0
	for _, s := range shares {
		if s.cap > 0 {
			known = true
			l = max(l, s.used/s.cap)
		}
	}
	if !known {
		return float64(used.Sandboxes)
	}
	return l
}

func hasLabels(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func formatLabels(m map[string]string) string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func formatDemand(r api.NodeResources) string {
	return fmt.Sprintf("%g CPUs, %.1f GiB memory, %.1f GiB disk", r.CPUs, float64(r.MemoryBytes)/(1<<30), float64(r.DiskBytes)/(1<<30))
}

// post sends a request body to the node as the client sent it, with the
// node's token, and returns its answer.
func (c *conns) post(r *http.Request, path string, body []byte) (*http.Response, error) {
	// Made as http.NewRequest would, from the node's parsed address: no
	// URL to parse and print, headers already in canonical form.
	u := *c.base
	u.Path = path
	out := &http.Request{
		Method: http.MethodPost, URL: &u, Host: u.Host,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{
			"Content-Type":  {"application/json"},
			"Authorization": {c.tokens.Authorization()},
		},
		Body:          io.NopCloser(bytes.NewReader(body)),
		GetBody:       func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil },
		ContentLength: int64(len(body)),
	}
	if len(body) == 0 {
		out.Body, out.GetBody = http.NoBody, nil
	}
	return c.tr.RoundTrip(out.WithContext(r.Context()))
}

// errorMessage reads the message of a node's error answer.
func errorMessage(resp *http.Response) string {
	defer resp.Body.Close()
	var e api.Error
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e); err != nil || e.Message == "" {
		return fmt.Sprintf("status %d", resp.StatusCode)
	}
	return e.Message
}

// states counts the table's nodes by state: "3 known: 1 draining, 2 lost".
func (t *table) states() string {
	if len(t.nodes) == 0 {
		return "the gateway knows no node"
	}
	count := map[string]int{}
	for _, n := range t.nodes {
		count[n.State]++
	}
	var parts []string
	for _, st := range []string{api.NodeReady, api.NodeDraining, api.NodeLost} {
		if count[st] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", count[st], st))
		}
	}
	return fmt.Sprintf("%d known: %s", len(t.nodes), strings.Join(parts, ", "))
}
