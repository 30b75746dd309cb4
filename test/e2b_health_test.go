package test

import (
	"net/http"
	"strings"
	"testing"
)

// TestE2BProbeWithoutKey: a caller without a sandbox's access token
// cannot tell whether the id exists. /health answers a live sandbox
// exactly as an unknown id (502) unless the token comes with it, and an
// envd call answers both with 401. Before, /health said 204 for any live
// id, and an envd call 502 for an unknown one.
func TestE2BProbeWithoutKey(t *testing.T) {
	e := startE2BDaemon(t)
	ans := e2bCall(t, e, "POST", "/sandboxes", `{}`)
	if ans.status != 201 {
		t.Fatalf("create: %d %s", ans.status, ans.body)
	}
	id, token := jsonField(t, ans.body, "sandboxID"), jsonField(t, ans.body, "envdAccessToken")
	unknown := "sb-" + randHex(6)
	call := func(method, path, sandbox, tok string) e2bAnswer {
		req, _ := http.NewRequest(method, e.URL+path, strings.NewReader(`{"path":"/"}`))
		req.Header.Set("E2b-Sandbox-Id", sandbox)
		req.Header.Set("Content-Type", "application/json")
		if tok != "" {
			req.Header.Set("X-Access-Token", tok)
		}
		return do(t, req)
	}
	for _, tok := range []string{"", "wrong-token"} {
		live, gone := call("GET", "/health", id, tok), call("GET", "/health", unknown, tok)
		if live.status != http.StatusBadGateway || gone.status != live.status ||
			strings.ReplaceAll(live.body, id, "ID") != strings.ReplaceAll(gone.body, unknown, "ID") {
			t.Errorf("/health with token %q: live %d %s, unknown %d %s; want the same 502", tok, live.status, live.body, gone.status, gone.body)
		}
		live, gone = call("POST", "/filesystem.Filesystem/Stat", id, tok), call("POST", "/filesystem.Filesystem/Stat", unknown, tok)
		if live.status != http.StatusUnauthorized || gone.status != live.status {
			t.Errorf("Stat with token %q: live %d %s, unknown %d %s; want 401 for both", tok, live.status, live.body, gone.status, gone.body)
		}
	}
	if got := call("GET", "/health", id, token); got.status != http.StatusNoContent {
		t.Errorf("/health with the token: %d %s, want 204", got.status, got.body)
	}
	if got := call("POST", "/filesystem.Filesystem/Stat", id, token); got.status != http.StatusOK {
		t.Errorf("Stat with the token: %d %s, want 200", got.status, got.body)
	}
}
