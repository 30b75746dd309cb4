package e2b

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestIngressPage(t *testing.T) {
	for _, tc := range []struct {
		accept, agent string
		html          bool
	}{
		{"", "", false},
		{"", "node", false},
		{"", "Mozilla/5.0 (X11; Linux x86_64) Chrome/120", true}, // E2B's rule when Accept does not choose
		{"*/*", "curl/8.5.0", false},
		{"*/*", "Mozilla/5.0", true},
		{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "", true},
		{"application/json", "Mozilla/5.0", false},
		{"application/json, text/html;q=0.5", "", false},
		{"text/html;q=0.9, application/json;q=0.1", "", true},
		{"text/*", "", true},
		{"text/html;q=0", "Mozilla/5.0", false},
		{"text/html;q=bad, application/json", "", false},
		{"garbage;;;", "", false},
	} {
		r := httptest.NewRequest("GET", "http://8000-abc.e2b.test/", nil)
		if tc.accept != "" {
			r.Header.Set("Accept", tc.accept)
		}
		r.Header.Set("User-Agent", tc.agent)
		w := httptest.NewRecorder()
		e := ingressError{SandboxID: "abc<script>", Message: "The sandbox is running but port is not open", Port: "8000"}
		ingressFail(w, r, http.StatusBadGateway, "Closed Port Error", e)
		if w.Code != http.StatusBadGateway {
			t.Errorf("%q %q: status %d", tc.accept, tc.agent, w.Code)
		}
		body := w.Body.String()
		if !tc.html {
			var got ingressError
			if ct := w.Header().Get("Content-Type"); ct != "application/json" || json.Unmarshal([]byte(body), &got) != nil || got != e {
				t.Errorf("%q %q: want E2B's JSON, got %s %q", tc.accept, tc.agent, ct, body)
			}
			continue
		}
		if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/html") ||
			!strings.Contains(body, "Closed Port Error") || !strings.Contains(body, "port is not open") ||
			!strings.Contains(body, "abc&lt;script&gt;") || strings.Contains(body, "abc<script>") {
			t.Errorf("%q %q: want an escaped HTML page, got %s %q", tc.accept, tc.agent, ct, body)
		}
	}
}
