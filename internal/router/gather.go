package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"github.com/paddock-dev/paddock/api"
)

// MissingNodesHeader names, on a gathered answer, the nodes that did not
// answer (lost, or unreachable): the answer holds what the others have.
const MissingNodesHeader = "Paddock-Missing-Nodes"

// maxGathered bounds one node's part of a gathered answer.
const maxGathered = 64 << 20

// answer is one node's answer to a gathered call.
type answer struct {
	n      *node
	status int
	body   []byte
	err    error
}

// fanOut sends r's method, path and query to every node not lost, at
// once, and returns their answers, and the names of the lost ones.
func (rt *Router) fanOut(r *http.Request) ([]answer, []string) {
	rt.mu.RLock()
	nodes := rt.table.nodes
	rt.mu.RUnlock()
	var missing []string
	answers := make([]answer, 0, len(nodes))
	for _, n := range nodes {
		if n.State == api.NodeLost {
			missing = append(missing, n.Name)
			continue
		}
		answers = append(answers, answer{n: n})
	}
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func(a *answer) {
			defer wg.Done()
			a.status, a.body, a.err = a.n.get(r.Context(), r.URL.Path, r.URL.RawQuery)
		}(&answers[i])
	}
	wg.Wait()
	return answers, missing
}

// get makes a GET call to the node and reads its whole answer.
func (c *conns) get(ctx context.Context, path, query string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	if err != nil {
		return 0, nil, err
	}
	req.URL.Path, req.URL.RawQuery = path, query
	req.Header.Set("Authorization", c.tokens.Authorization())
	return c.fetch(req, c.base)
}

// fetch sends req to the node at base and reads its whole answer.
func (c *conns) fetch(req *http.Request, base *url.URL) (int, []byte, error) {
	req.URL.Scheme, req.URL.Host, req.Host, req.RequestURI = base.Scheme, base.Host, base.Host, ""
	resp, err := c.tr.RoundTrip(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxGathered+1))
	if err == nil && len(body) > maxGathered {
		err = fmt.Errorf("answer exceeds %d bytes", maxGathered)
	}
	return resp.StatusCode, body, err
}

// sortAnswers sorts the answers of a fan-out: the good bodies, the nodes that
// did not answer added to missing, or the first error a node answered
// with (a bad query: every node would say the same).
func (rt *Router) sortAnswers(answers []answer, missing []string) (bodies []answer, _ []string, failed *answer) {
	for i, a := range answers {
		switch {
		case a.err != nil || a.status == http.StatusServiceUnavailable || a.status >= 500:
			rt.log.Warn("node left out of a gathered answer", "node", a.n.Name, "status", a.status, "err", a.err)
			missing = append(missing, a.n.Name)
		case a.status != http.StatusOK:
			if failed == nil {
				failed = &answers[i]
			}
		default:
			bodies = append(bodies, a)
		}
	}
	return bodies, missing, failed
}

// gather answers a list gathered from every node (GET /v1/sandboxes,
// GET /v1/snapshots, GET /v1/metrics): every node's JSON array, the items
// passed on as they are. A node that does not answer is named in
// MissingNodesHeader and the others' items still come.
func (rt *Router) gather(w http.ResponseWriter, r *http.Request) {
	parts, ok := rt.gatherJSON(w, r, r.URL.Path, func(b []byte) (any, error) {
		var part []json.RawMessage
		err := json.Unmarshal(b, &part)
		return part, err
	})
	if !ok {
		return
	}
	items := []json.RawMessage{}
	for _, part := range parts {
		items = append(items, part.([]json.RawMessage)...)
	}
	writeJSON(w, http.StatusOK, items)
}

// prometheus answers GET /metrics: every node's metrics, each sample
// labelled with its node, in one exposition.
func (rt *Router) prometheus(w http.ResponseWriter, r *http.Request) {
	answers, missing := rt.fanOut(r)
	bodies, missing, _ := rt.sortAnswers(answers, missing)
	families := map[string]*dto.MetricFamily{}
	for _, a := range bodies {
		p := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := p.TextToMetricFamilies(strings.NewReader(string(a.body)))
		if err != nil {
			rt.log.Warn("node's Prometheus metrics do not parse", "node", a.n.Name, "err", err)
			missing = append(missing, a.n.Name)
			continue
		}
		for name, mf := range mfs {
			for _, m := range mf.Metric {
				m.Label = append(m.Label, &dto.LabelPair{Name: proto.String("node"), Value: proto.String(a.n.Name)})
			}
			if have := families[name]; have != nil {
				have.Metric = append(have.Metric, mf.Metric...)
			} else {
				families[name] = mf
			}
		}
	}
	names := make([]string, 0, len(families))
	for name := range families {
		names = append(names, name)
	}
	sort.Strings(names)
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	w.Header().Set("Content-Type", string(format))
	if len(missing) > 0 {
		w.Header().Set(MissingNodesHeader, strings.Join(missing, ", "))
	}
	enc := expfmt.NewEncoder(w, format)
	for _, name := range names {
		if err := enc.Encode(families[name]); err != nil {
			rt.log.Warn("encoding Prometheus metrics", "family", name, "err", err)
			return
		}
	}
}
