package server

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/sandbox"
)

// TestControlRoutes: every route a control socket serves is one of the
// API's, so a renamed route cannot silently drop out of (or widen) it.
func TestControlRoutes(t *testing.T) {
	s := New(nil, api.VersionInfo{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, p := range controlRoutes {
		if !slices.ContainsFunc(s.routes, func(r route) bool { return r.pattern == p }) {
			t.Errorf("control route %q is not a route of the API", p)
		}
	}
}

// TestControlRefusals: what a control socket refuses before any sandbox
// is looked up.
func TestControlRefusals(t *testing.T) {
	s := New(nil, api.VersionInfo{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	h := s.ControlHandler(sandbox.ControlScope{Sandbox: "aaaaaaaaaaaa", Container: "harness", Controls: []string{"tools"}, First: "harness"})
	for _, tc := range []struct {
		method, path string
		want         int
		says         string
	}{
		{"GET", "/v1/sandboxes", 403, "serves only"},
		{"POST", "/v1/sandboxes/aaaaaaaaaaaa/stop", 403, "serves only"},
		{"GET", "/v1/sandboxes/aaaaaaaaaaaa/policy", 403, "serves only"},
		{"POST", "/v1/sandboxes/bbbbbbbbbbbb/exec?container=tools", 403, "its own sandbox"},
		{"POST", "/v1/sandboxes/aaaaaaaaaaaa/exec", 403, "holds this control socket"},
		{"POST", "/v1/sandboxes/aaaaaaaaaaaa/exec?container=harness", 403, "holds this control socket"},
		{"GET", "/v1/sandboxes/aaaaaaaaaaaa/files?path=/x&container=db", 403, "does not control container db"},
		{"POST", "/v1/sandboxes/aaaaaaaaaaaa/exec?container=TOOLS", 400, "container"},
		{"POST", "/v1/sandboxes/aaaaaaaaaaaa/../bbbbbbbbbbbb/exec", 400, "dot segments"},
		{"GET", "/v1/lane", 404, "no exec lanes"},
		{"GET", "/v1/sandboxes/aaaaaaaaaaaa/lane", 404, "no exec lanes"},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, strings.NewReader("{}")))
		if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.says) {
			t.Errorf("%s %s: %d %s, want %d saying %q", tc.method, tc.path, w.Code, w.Body, tc.want, tc.says)
		}
	}
}
