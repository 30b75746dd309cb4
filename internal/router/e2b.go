package router

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/connlimit"
	"github.com/paddock-dev/paddock/internal/e2b"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// E2BHandler serves the E2B-compatible API of the cluster: envd calls
// (with E2b-Sandbox-Id, and the sandbox's own access token, which the
// node checks) go to the sandbox's node as they are; control-plane calls
// need the gateway's API key (e2b.APIKey of one of its tokens), which the
// gateway replaces with the node's. A create is placed as a native one
// (its templateID is the pool it prefers); a list gathers every node's.
func (rt *Router) E2BHandler(tokens *clustertls.Tokens) http.Handler {
	domain := strings.ToLower(strings.Trim(rt.cfg.E2BDomain, "."))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A sandbox's host name is routed by the Host alone: its path is
		// the sandbox app's, passed on as it is.
		if port, id, ok := e2b.HostTarget(r.Host, domain); ok {
			rt.e2bHostRoute(w, r, id, port)
			return
		}
		p := r.URL.EscapedPath()
		if strings.Contains(p, "//") || strings.Contains(p, "%") || strings.Contains(p, "/./") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
			e2bError(w, errdefs.Invalid("path", "%q has dot segments, empty segments or escapes", p))
			return
		}
		if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
			rt.e2bRoute(w, r, id, false)
			return
		}
		if p == "/files" && r.URL.Query().Has("signature") {
			rt.e2bSigned(w, r)
			return
		}
		got := r.Header.Get("X-API-Key")
		if got == "" {
			got = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		}
		if !acceptsKey(tokens, got) {
			writeJSON(w, http.StatusUnauthorized, e2bErrorBody{Code: http.StatusUnauthorized, Message: "missing or wrong API key (X-API-KEY)"})
			return
		}
		connlimit.Authenticated(w, r)
		rest, _ := strings.CutPrefix(p, "/v2")
		switch {
		case rest == "/sandboxes" && r.Method == http.MethodPost:
			rt.e2bCreate(w, r)
		case rest == "/sandboxes" && r.Method == http.MethodGet:
			rt.e2bList(w, r)
		case strings.HasPrefix(rest, "/sandboxes/"):
			id, _, _ := strings.Cut(strings.TrimPrefix(rest, "/sandboxes/"), "/")
			rt.e2bRoute(w, r, id, true)
		default:
			e2bError(w, errdefs.New(errdefs.ErrNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
		}
	})
}

// acceptsKey reports whether got is the E2B API key of one of tokens,
// each compared in constant time.
func acceptsKey(tokens *clustertls.Tokens, got string) bool {
	ok := 0
	for _, t := range tokens.All() {
		ok |= subtle.ConstantTimeCompare([]byte(got), []byte(e2b.APIKey(t)))
	}
	return ok == 1
}

// e2bErrorBody is E2B's error body.
type e2bErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// e2bError answers err in E2B's form, with the status of paddock's one
// mapping.
func e2bError(w http.ResponseWriter, err error) {
	code := errdefs.HTTPStatus(err)
	writeJSON(w, code, e2bErrorBody{Code: code, Message: err.Error()})
}

// e2bRoute passes a call for sandbox id to its node's facade; control
// calls carry the node's key instead of the gateway's.
func (rt *Router) e2bRoute(w http.ResponseWriter, r *http.Request, id string, control bool) {
	n, err := rt.owner(id, id)
	if err != nil && rt.cfg.Archive != nil {
		n, err = rt.archivedOwner(r.Context(), id, err)
	}
	if err == nil && n.e2bProxy == nil {
		err = errdefs.New(errdefs.ErrUnavailable, "node %s serves no E2B facade", n.Name)
	}
	if err != nil {
		e2bError(w, err)
		return
	}
	keepBody(r)
	rt.e2bServe(w, r.WithContext(context.WithValue(r.Context(), e2bCallKey{}, e2bCall{id: id, control: control})), n, control)
}

// e2bServe passes an E2B call to node n's facade.
func (rt *Router) e2bServe(w http.ResponseWriter, r *http.Request, n *node, control bool) {
	if n.e2bProxy == nil {
		e2bError(w, errdefs.New(errdefs.ErrUnavailable, "node %s serves no E2B facade", n.Name))
		return
	}
	if control {
		n.asNode(r)
		n.e2bProxy.ServeHTTP(w, r)
		return
	}
	// The node checks an envd call's access token and says when the caller
	// held it (e2b.VouchedHeader, whatever the status: a missing file is a
	// 404 to an authenticated caller); the connection then counts as
	// authenticated here too (connlimit), so that kept and streaming envd
	// connections stay open rather than close after an answer while the
	// client sends its next request on them.
	n.e2bProxy.ServeHTTP(&vouched{ResponseWriter: w, r: r}, r)
}

// e2bCallKey carries an E2B call's e2bCall, for e2bFollow.
type e2bCallKey struct{}

// e2bCall is the sandbox an E2B call names, and whether it is a
// control-plane call.
type e2bCall struct {
	id      string
	control bool
}

// maxReplay bounds the body the gateway keeps to send an E2B call again
// to the node a sandbox moved to: envd's calls and the control plane's
// are small messages; an upload is not kept.
const maxReplay = 64 << 10

// keepBody reads a small body of known length whole, so that the call
// can be sent again (r.GetBody).
func keepBody(r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength < 0 || r.ContentLength > maxReplay {
		return
	}
	// A body that breaks goes on as far as it came: the node answers it
	// as a short body, and it is not sent again.
	b, err := io.ReadAll(io.LimitReader(r.Body, r.ContentLength))
	r.Body = io.NopCloser(bytes.NewReader(b))
	if err == nil {
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
}

// e2bFollow serves an E2B call that the node of the id's tag answered
// with "moved to node to" (errdefs.MovedHeader): there, if that node is
// live and the call's body can be sent again; else an error saying what
// to do. Where the sandbox went is cached, so the next call goes there
// first.
func (rt *Router) e2bFollow(w http.ResponseWriter, r *http.Request, to string) {
	call, _ := r.Context().Value(e2bCallKey{}).(e2bCall)
	if call.id == "" || r.Context().Value(followedKey{}) != nil {
		e2bError(w, &errdefs.MovedError{ID: call.id, Node: to})
		return
	}
	n := rt.byName(to)
	if n == nil {
		e2bError(w, errdefs.New(errdefs.ErrUnavailable, "sandbox %s moved to node %s, which is not in the cluster", call.id, to))
		return
	}
	rt.movedTo.set(call.id, n.Name)
	if r.Body != nil && r.Body != http.NoBody {
		if r.GetBody == nil {
			e2bError(w, errdefs.New(errdefs.ErrUnavailable, "sandbox %s moved to node %s (restored there from the archive): try the call again", call.id, to))
			return
		}
		body, _ := r.GetBody()
		r.Body = body
	}
	rt.e2bServe(w, r.WithContext(context.WithValue(r.Context(), followedKey{}, true)), n, call.control)
}

// e2bMovedAnswer is movedAnswer for a node's facade, whose envd answers a
// sandbox that moved with E2B's 502 and its control plane with 404, both
// naming the node.
func e2bMovedAnswer(resp *http.Response) error {
	if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusBadGateway {
		return nil
	}
	if to := resp.Header.Get(errdefs.MovedHeader); to != "" {
		return &movedError{node: to}
	}
	return nil
}

// keepHostKey marks a request whose Host the node must see: one routed
// by its PORT-ID.DOMAIN name.
type keepHostKey struct{}

// e2bHostRoute passes a request for PORT-ID.DOMAIN to the id's node with
// its Host, where the facade serves it as a single daemon does: envd
// (signed URLs included) on port 49983, the sandbox's port otherwise.
// A sandbox no node holds gets E2B's 502.
func (rt *Router) e2bHostRoute(w http.ResponseWriter, r *http.Request, id string, port int) {
	if _, err := rt.owner(id, id); err != nil && rt.cfg.Archive == nil {
		e2b.IngressNotRunning(w, r, id, port)
		return
	}
	rt.e2bRoute(w, r.WithContext(context.WithValue(r.Context(), keepHostKey{}, true)), id, false)
}

// vouched marks its request's connection authenticated when the node's
// answer says the caller held the sandbox's access token.
type vouched struct {
	http.ResponseWriter
	r *http.Request
}

func (v *vouched) WriteHeader(code int) {
	if v.Header().Get(e2b.VouchedHeader) != "" {
		v.Header().Del(e2b.VouchedHeader)
		connlimit.Authenticated(v.ResponseWriter, v.r)
	}
	v.ResponseWriter.WriteHeader(code)
}

func (v *vouched) Unwrap() http.ResponseWriter { return v.ResponseWriter }

// e2bKey is the node's API key: the one of the token the gateway
// presents.
func (c *conns) e2bKey() string { return e2b.APIKey(c.tokens.Present()) }

// asNode makes a control-plane request carry the node's API key.
func (c *conns) asNode(r *http.Request) {
	r.Header.Set("X-API-Key", c.e2bKey())
	if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		r.Header.Del("Authorization")
	}
}

// e2bCreate places an E2B create (POST /sandboxes, /v2/sandboxes).
func (rt *Router) e2bCreate(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r)
	if err != nil {
		e2bError(w, err)
		return
	}
	var req struct {
		TemplateID string `json:"templateID"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		e2bError(w, errdefs.Invalid("body", "%v", err))
		return
	}
	if req.TemplateID == "" {
		req.TemplateID = "base"
	}
	d, err := rt.demandOf(api.Resources{}, nil, req.TemplateID, "")
	if err != nil {
		e2bError(w, err)
		return
	}
	rt.place(w, r, d, func(err error) { e2bError(w, err) }, func(n *node) (*http.Response, error) {
		if n.e2bProxy == nil {
			return nil, fmt.Errorf("it serves no E2B facade")
		}
		return n.postE2B(r, body)
	})
}

// postE2B sends an E2B create to the node's facade with the node's key.
func (c *conns) postE2B(r *http.Request, body []byte) (*http.Response, error) {
	u := *c.e2bBase
	u.Path = r.URL.Path
	out, err := http.NewRequestWithContext(r.Context(), http.MethodPost, u.String(), strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	out.Header.Set("Content-Type", "application/json")
	out.Header.Set("X-API-Key", c.e2bKey())
	return c.tr.RoundTrip(out)
}

// e2bList answers GET /sandboxes and /v2/sandboxes with every node's
// list, one after the other. Paging does not span nodes: each node's
// page comes whole and no next token is passed on.
func (rt *Router) e2bList(w http.ResponseWriter, r *http.Request) {
	rt.mu.RLock()
	nodes := rt.table.nodes
	rt.mu.RUnlock()
	var items []json.RawMessage
	var missing []string
	for _, n := range nodes {
		if n.e2bProxy == nil {
			continue
		}
		if n.State == api.NodeLost {
			missing = append(missing, n.Name)
			continue
		}
		status, body, err := n.getE2B(r)
		var part []json.RawMessage
		switch {
		case err != nil || status >= 500:
			missing = append(missing, n.Name)
			continue
		case status != http.StatusOK:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			w.Write(body)
			return
		case json.Unmarshal(body, &part) != nil:
			missing = append(missing, n.Name)
			continue
		}
		items = append(items, part...)
	}
	if items == nil {
		items = []json.RawMessage{}
	}
	if len(missing) > 0 {
		w.Header().Set(MissingNodesHeader, strings.Join(missing, ", "))
	}
	writeJSON(w, http.StatusOK, items)
}

// getE2B sends a GET to the node's facade with the node's key.
func (c *conns) getE2B(r *http.Request) (int, []byte, error) {
	out := r.Clone(r.Context())
	c.asNode(out)
	return c.fetch(out, c.e2bBase)
}

// newE2BProxy is the reverse proxy to a node's facade at addr.
func (c *conns) newE2BProxy(addr string) error {
	base, err := url.Parse(addr)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return errdefs.Invalid("e2b_address", "%q is not http(s)://HOST:PORT", addr)
	}
	base.Path = ""
	c.e2bBase = base
	c.e2bProxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(c.e2bBase)
			if pr.In.Context().Value(keepHostKey{}) != nil {
				pr.Out.Host = pr.In.Host
			}
			sendLength(pr)
		},
		Transport:      c.tr,
		BufferPool:     bufferPool{},
		ModifyResponse: e2bMovedAnswer,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if mv := (*movedError)(nil); errors.As(err, &mv) {
				c.e2bMoved(w, r, mv.node)
				return
			}
			if r.Context().Err() == nil {
				e2bError(w, c.unreachable(err))
			}
		},
		ErrorLog: c.proxy.ErrorLog,
	}
	return nil
}
