package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
)

// TestFileParams checks that the file endpoints refuse bad arguments
// before they look for the sandbox, naming the argument.
func TestFileParams(t *testing.T) {
	h := New(nil, api.VersionInfo{}, slog.New(slog.NewTextHandler(io.Discard, nil))).Handler("")
	const base = "/v1/sandboxes/sb1/files"
	for _, tc := range []struct {
		method, target, body string
		status               int
		names                string
	}{
		{"GET", base, "", 400, "path: required"},
		{"GET", base + "?path=", "", 400, "path: required"},
		{"GET", base + "?path=%00", "", 400, "path: contains a NUL"},
		{"GET", base + "?path=/" + strings.Repeat("a", 4100), "", 400, "path: longer"},
		{"GET", base + "?path=/a&offset=-1", "", 400, "offset"},
		{"GET", base + "?path=/a&length=x", "", 400, "length"},
		{"PUT", base + "?path=/a&mode=999", "data", 400, "mode"},
		{"PUT", base + "?path=/a&mode=17777", "data", 400, "mode"},
		{"PUT", base + "?path=/a&owner=a%0Ab", "data", 400, "owner"},
		{"PUT", base, "data", 400, "path: required"},
		{"GET", base + "/stat", "", 400, "path: required"},
		{"GET", base + "/list?path=/a&depth=0", "", 400, "depth"},
		{"GET", base + "/list?path=/a&depth=x", "", 400, "depth"},
		{"POST", base + "/mkdir", `{}`, 400, "path: required"},
		{"POST", base + "/mkdir", `{"path":"/a","mode":"rwx"}`, 400, "mode"},
		{"POST", base + "/mkdir", `{"path":"/a","mode":644}`, 400, "mode"},
		{"POST", base + "/mkdir", `{"path":"/a","bogus":1}`, 400, "bogus"},
		{"POST", base + "/remove", `{"recursive":true}`, 400, "path: required"},
		{"POST", base + "/move", `{"from":"/a"}`, 400, "to: required"},
		{"POST", base + "/move", `{"to":"/a"}`, 400, "from: required"},
		{"GET", base + "/tar", "", 400, "path: required"},
		{"PUT", base + "/tar?owner=%00", "", 400, "path: required"},
		{"GET", base + "/watch?path=/a&recursive=maybe", "", 400, "recursive"},
		{"PATCH", base + "?path=/a", "", 405, "not allowed"},
		{"DELETE", base + "/tar?path=/a", "", 405, "not allowed"},
	} {
		w := httptest.NewRecorder()
		var body io.Reader
		if tc.body != "" {
			body = strings.NewReader(tc.body)
		}
		h.ServeHTTP(w, httptest.NewRequest(tc.method, tc.target, body))
		var e api.Error
		json.NewDecoder(w.Body).Decode(&e)
		if w.Code != tc.status || !strings.Contains(e.Message, tc.names) {
			t.Errorf("%s %.60s: %d %q, want %d naming %q", tc.method, tc.target, w.Code, e.Message, tc.status, tc.names)
		}
	}
}
