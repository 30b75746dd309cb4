package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Local is the gateway's own API called in process, as a controller of
// the gateway calls it: a create is placed, a call routed, exactly as a
// client's would be.
type Local struct{ rt *Router }

// Local returns the in-process caller of rt's API.
func (rt *Router) Local() Local { return Local{rt} }

// Create creates a sandbox through the gateway.
func (l Local) Create(ctx context.Context, req api.CreateRequest) (api.Sandbox, error) {
	var sb api.Sandbox
	err := l.do(ctx, http.MethodPost, "/v1/sandboxes", req, &sb)
	return sb, err
}

// Get describes a sandbox.
func (l Local) Get(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := l.do(ctx, http.MethodGet, "/v1/sandboxes/"+id, nil, &sb)
	return sb, err
}

// Remove removes a sandbox, running or not.
func (l Local) Remove(ctx context.Context, id string) error {
	return l.do(ctx, http.MethodDelete, "/v1/sandboxes/"+id+"?force=true", nil, nil)
}

// NodeOf names the node whose tag starts id, or "".
func (l Local) NodeOf(id string) string {
	l.rt.mu.RLock()
	t := l.rt.table
	l.rt.mu.RUnlock()
	if n, err := t.owner(id, id); err == nil {
		return n.Name
	}
	return ""
}

// List lists the sandboxes of every node that answers.
func (l Local) List(ctx context.Context) ([]api.Sandbox, error) {
	var out []api.Sandbox
	err := l.do(ctx, http.MethodGet, "/v1/sandboxes", nil, &out)
	return out, err
}

// Lost says the node whose tag starts id is lost.
func (l Local) Lost(id string) bool {
	l.rt.mu.RLock()
	t := l.rt.table
	l.rt.mu.RUnlock()
	n, err := t.owner(id, id)
	return err == nil && n.State == api.NodeLost
}

// do serves one request in process. An error answer comes back as an
// error of its category (errdefs), with the message the client would
// see.
func (l Local) do(ctx context.Context, method, path string, in, out any) error {
	var body bytes.Buffer
	if in != nil {
		if err := json.NewEncoder(&body).Encode(in); err != nil {
			return err
		}
	}
	r, err := http.NewRequestWithContext(ctx, method, "http://gateway"+path, &body)
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	r.RequestURI = r.URL.RequestURI()
	w := &recorder{header: http.Header{}, status: http.StatusOK}
	l.rt.serve(w, r)
	if w.status >= 300 {
		var e api.Error
		if json.Unmarshal(w.body.Bytes(), &e) != nil || e.Message == "" {
			return fmt.Errorf("%s %s: status %d", method, path, w.status)
		}
		return &answerError{msg: e.Message, category: errdefs.FromCode(e.Code)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(w.body.Bytes(), out); err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	return nil
}

// recorder is the ResponseWriter of an in-process call.
type recorder struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
}

func (w *recorder) Write(b []byte) (int, error) {
	w.wrote = true
	return w.body.Write(b)
}

// answerError is an error answer: the message the client would see, of
// its category.
type answerError struct {
	msg      string
	category error
}

func (e *answerError) Error() string { return e.msg }
func (e *answerError) Unwrap() error { return e.category }
