package test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// TestAPIErrors sends bad requests over the daemon's socket with plain
// net/http (raw bytes for oversized bodies): each gets
// the right status and a JSON {code, message} naming the problem, and the
// daemon keeps serving afterwards.
func TestAPIErrors(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	stopped := d.Create(api.CreateRequest{})
	if _, err := d.Client().Stop(t.Context(), stopped); err != nil {
		t.Fatal(err)
	}
	huge := `{"image":"` + strings.Repeat("a", 2<<20) + `"}`

	tests := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		// inMessage must all appear in the error message.
		inMessage []string
	}{
		{"unknown id", "GET", "/v1/sandboxes/nosuchbox", "", 404, []string{"nosuchbox"}},
		{"unknown id delete", "DELETE", "/v1/sandboxes/nosuchbox?force=true", "", 404, []string{"nosuchbox"}},
		{"unknown id exec", "POST", "/v1/sandboxes/nosuchbox/exec", `{"cmd":["true"]}`, 404, []string{"nosuchbox"}},
		{"unknown endpoint", "GET", "/v1/nothing-here", "", 404, nil},
		{"bad memory", "POST", "/v1/sandboxes", `{"resources":{"memory_bytes":5}}`, 400, []string{"memory_bytes"}},
		{"negative memory", "POST", "/v1/sandboxes", `{"resources":{"memory_bytes":-1}}`, 400, []string{"memory_bytes"}},
		{"bad cpus", "POST", "/v1/sandboxes", `{"resources":{"cpus":1000}}`, 400, []string{"cpus"}},
		{"bad pids", "POST", "/v1/sandboxes", `{"resources":{"pids":1}}`, 400, []string{"pids"}},
		{"bad disk", "POST", "/v1/sandboxes", `{"resources":{"disk_bytes":1024}}`, 400, []string{"disk_bytes"}},
		{"bad timeout", "POST", "/v1/sandboxes", `{"timeout_seconds":-3}`, 400, []string{"timeout_seconds"}},
		{"bad env name", "POST", "/v1/sandboxes", `{"env":{"A B":"x"}}`, 400, []string{"env"}},
		{"relative workdir", "POST", "/v1/sandboxes", `{"workdir":"tmp"}`, 400, []string{"workdir"}},
		{"unknown image", "POST", "/v1/sandboxes", `{"image":"no-such-image-e2e"}`, 400, []string{"no-such-image-e2e"}},
		{"unknown field", "POST", "/v1/sandboxes", `{"memroy":"1g"}`, 400, []string{"memroy"}},
		{"unknown nested field", "POST", "/v1/sandboxes", `{"resources":{"gpus":1}}`, 400, []string{"gpus"}},
		{"malformed JSON", "POST", "/v1/sandboxes", `{"image":`, 400, []string{"JSON"}},
		{"not JSON", "POST", "/v1/sandboxes", `image=host`, 400, []string{"JSON"}},
		{"trailing data", "POST", "/v1/sandboxes", `{} {}`, 400, nil},
		{"empty body", "POST", "/v1/sandboxes", ``, 400, nil},
		{"wrong type", "POST", "/v1/sandboxes", `{"resources":{"memory_bytes":"1g"}}`, 400, []string{"memory_bytes"}},
		{"wrong type top level", "POST", "/v1/sandboxes", `{"labels":["a"]}`, 400, []string{"labels"}},
		{"exec without cmd", "POST", "/v1/sandboxes/" + stopped + "/exec", `{"cmd":[]}`, 400, []string{"cmd"}},
		{"exec unknown field", "POST", "/v1/sandboxes/" + stopped + "/exec", `{"cmd":["true"],"tty":true}`, 400, []string{"tty"}},
		{"bad force", "DELETE", "/v1/sandboxes/" + stopped + "?force=maybe", "", 400, []string{"force"}},
		{"bad state filter", "GET", "/v1/sandboxes?state=sleeping", "", 400, []string{"state"}},
		{"oversized body", "POST", "/v1/sandboxes", huge, 413, nil},
		{"oversized exec body", "POST", "/v1/sandboxes/" + stopped + "/exec", `{"cmd":["true"],"stdin":"` + strings.Repeat("x", 2<<20) + `"}`, 413, nil},
		{"encoded dot-dot", "GET", "/v1/sandboxes/..%2f..%2fetc", "", 400, nil},
		{"encoded slash", "GET", "/v1/sandboxes/a%2Fb", "", 400, nil},
		{"dot-dot segment", "GET", "/v1/sandboxes/../x", "", 400, nil},
		{"dot-dot exec", "POST", "/v1/sandboxes/../sandboxes/x/exec", `{"cmd":["true"]}`, 400, nil},
		{"encoded dot", "DELETE", "/v1/sandboxes/%2e%2e", "", 400, nil},
		{"wrong method on collection", "PUT", "/v1/sandboxes", `{}`, 405, []string{"PUT"}},
		{"wrong method on sandbox", "PATCH", "/v1/sandboxes/" + stopped, `{}`, 405, []string{"PATCH"}},
		{"wrong method on exec", "GET", "/v1/sandboxes/" + stopped + "/exec", "", 405, []string{"GET"}},
		{"exec in a stopped sandbox", "POST", "/v1/sandboxes/" + stopped + "/exec", `{"cmd":["true"]}`, 409, []string{stopped}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a httpAnswer
			if len(tt.body) > 1<<20 {
				// Sent as raw bytes: the daemon answers and closes before
				// it has read the whole body, and a writer that stops at
				// the broken pipe might never read that answer.
				req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: paddock\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
					tt.method, tt.path, len(tt.body), tt.body)
				a = d.rawRequest([]byte(req))
			} else {
				a = d.do(tt.method, tt.path, tt.body)
			}
			if a.Status != tt.status {
				t.Errorf("%s %s: status %d, want %d; body %.300s", tt.method, tt.path, a.Status, tt.status, a.Body)
			}
			e := a.apiError(t)
			for _, want := range tt.inMessage {
				if !strings.Contains(e.Message, want) {
					t.Errorf("message %q does not name %q", e.Message, want)
				}
			}
			// RFC 9110, 15.5.6: a 405 answer must list the allowed methods.
			if tt.status == http.StatusMethodNotAllowed && a.Header.Get("Allow") == "" {
				t.Errorf("405 without an Allow header")
			}
			wantCode := map[int]string{400: "invalid_argument", 404: "not_found", 409: "conflict", 413: "too_large"}[tt.status]
			if wantCode != "" && e.Code != wantCode {
				t.Errorf("code %q, want %q", e.Code, wantCode)
			}
		})
	}

	// Nothing of the above created or broke anything.
	list, err := d.Client().List(t.Context(), client.ListOptions{})
	if err != nil {
		t.Fatalf("list after bad requests: %v", err)
	}
	if len(list) != 1 || list[0].ID != stopped || list[0].State != api.StateStopped {
		t.Errorf("sandboxes after bad requests: %+v, want only %s, stopped", list, stopped)
	}
	id := d.Create(api.CreateRequest{})
	if out := d.Sh(id, "echo still serving"); out != "still serving\n" {
		t.Errorf("exec after bad requests: %q", out)
	}
	if a := d.do(http.MethodGet, "/v1/version", ""); a.Status != 200 {
		t.Errorf("version after bad requests: %d %s", a.Status, a.Body)
	}
}
