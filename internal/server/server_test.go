package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
)

func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{errdefs.NotFound("sandbox", "x"), 404},
		{errdefs.Invalid("cpus", "bad"), 400},
		{errdefs.Conflict("stopped"), 409},
		{fmt.Errorf("wrapped: %w", errdefs.ErrDenied), 403},
		{errdefs.ErrTooLarge, 413},
		{errdefs.ErrUnavailable, 503},
		{errors.New("boom"), 500},
		{&HTTPError{Code: 405, Msg: "no"}, 405},
	} {
		if got := status(tc.err); got != tc.want {
			t.Errorf("status(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestWriteErrorHidesInternalDetail(t *testing.T) {
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/v1/x", nil)
	writeError(w, r, slog.New(slog.NewTextHandler(io.Discard, nil)), errors.New("secret detail /var/lib/x"))
	var body api.Error
	json.NewDecoder(w.Body).Decode(&body)
	if w.Code != 500 || body.Code != "internal" || strings.Contains(body.Message, "secret") {
		t.Fatalf("got %d %+v", w.Code, body)
	}
}

func TestDecode(t *testing.T) {
	type req struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
	}
	for _, tc := range []struct {
		body     string
		wantCode string
		wantIn   string
	}{
		{`{"name":"a","count":1}`, "", ""},
		{``, "invalid_argument", "empty"},
		{`{"name":`, "invalid_argument", "truncated"},
		{`{"name":"a",}`, "invalid_argument", "malformed JSON"},
		{`{"nope":1}`, "invalid_argument", "nope"},
		{`{"count":"x"}`, "invalid_argument", "count"},
		{`{"name":"a"} {"name":"b"}`, "invalid_argument", "after the JSON"},
		{`{"name":"` + strings.Repeat("a", reqcheck.MaxBody) + `"}`, "too_large", "exceeds"},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", strings.NewReader(tc.body))
		var v req
		err := decode(w, r, &v)
		if tc.wantCode == "" {
			if err != nil {
				t.Errorf("decode(%.30q) = %v", tc.body, err)
			}
			continue
		}
		if err == nil || errdefs.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantIn) {
			t.Errorf("decode(%.30q) = %v, want %s mentioning %q", tc.body, err, tc.wantCode, tc.wantIn)
		}
	}
}

func TestSanePath(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) })
	h := s.sanePath(ok)
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/v1/sandboxes/abc", 299},
		{"/v1/sandboxes/../etc", 400},
		{"/v1/sandboxes/./x", 400},
		{"/v1/sandboxes/a%2Fb", 400},
		{"/v1/sandboxes/..%2f..%2fetc", 400},
		{"/v1/sandboxes/%2e%2e", 400},
		{"/v1//sandboxes", 400},
		{"/v1/sandboxes/a%5Cb", 400},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "http://x"+tc.path, nil)
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s: %d, want %d", tc.path, w.Code, tc.want)
		}
	}
}

func TestAuth(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) })
	h := RequireToken("0123456789abcdef", s.log, ok)
	for _, tc := range []struct {
		header string
		want   int
	}{
		{"", 401},
		{"Bearer wrong", 401},
		{"Bearer 0123456789abcdef", 299},
		{"bearer 0123456789abcdef", 401},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/v1/version", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("Authorization %q: %d, want %d", tc.header, w.Code, tc.want)
		}
	}
}

func TestValidateExec(t *testing.T) {
	for _, tc := range []struct {
		req api.ExecRequest
		ok  bool
	}{
		{api.ExecRequest{Cmd: []string{"ls"}}, true},
		{api.ExecRequest{}, false},
		{api.ExecRequest{Cmd: []string{""}}, false},
		{api.ExecRequest{Cmd: []string{"a\x00b"}}, false},
		{api.ExecRequest{Cmd: []string{"ls"}, Cwd: "relative"}, false},
		{api.ExecRequest{Cmd: []string{"ls"}, Cwd: "/a/../b"}, false},
		{api.ExecRequest{Cmd: []string{"ls"}, Env: map[string]string{"A=B": "x"}}, false},
	} {
		if err := reqcheck.Exec(&tc.req); (err == nil) != tc.ok {
			t.Errorf("reqcheck.Exec(%+v) = %v", tc.req, err)
		}
	}
}
