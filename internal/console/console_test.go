package console

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

const token = "tok-123"

// apiStub stands for the API: it answers 200 to a request with the bearer
// token and reports whether the console's cookie reached it.
func apiStub(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := r.Cookie(CookieName); err == nil {
			t.Errorf("%s %s: the console's cookie reached the API", r.Method, r.URL.Path)
		}
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "ok")
	})
}

func newTest(t *testing.T) (http.Handler, string) {
	t.Helper()
	c := New(Config{Token: token, Log: slog.New(slog.DiscardHandler)})
	h := c.Wrap(apiStub(t))
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "http://paddock.test/ui/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	h.ServeHTTP(w, r)
	for _, ck := range w.Result().Cookies() {
		if ck.Name == CookieName {
			if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
				t.Fatalf("cookie %+v: want HttpOnly and SameSite=Strict", ck)
			}
			return h, ck.Value
		}
	}
	t.Fatalf("login set no cookie: %d %v", w.Code, w.Header())
	return nil, ""
}

func TestConsoleAuth(t *testing.T) {
	h, sess := newTest(t)
	csrf := sessions{token: token}.csrf(sess)
	cases := []struct {
		name    string
		method  string
		path    string
		cookie  string
		headers map[string]string
		want    int
	}{
		{"page without cookie goes to login", "GET", "/ui/", "", map[string]string{"Accept": "text/html"}, http.StatusSeeOther},
		{"asset without cookie", "GET", "/ui/assets/app.js", "", nil, http.StatusUnauthorized},
		{"terminal without cookie", "GET", "/ui/ws/terminal/abc", "", map[string]string{"Upgrade": "websocket", "Connection": "Upgrade"}, http.StatusUnauthorized},
		{"unknown page without cookie", "GET", "/ui/nope", "", nil, http.StatusUnauthorized},
		{"forged cookie", "GET", "/ui/", "1.abc", nil, http.StatusUnauthorized},
		{"page with cookie", "GET", "/ui/", sess, nil, http.StatusOK},
		{"sandbox page with cookie", "GET", "/ui/sandboxes/abc", sess, nil, http.StatusOK},
		{"login page is public", "GET", "/ui/login", "", nil, http.StatusOK},
		{"api without anything", "GET", "/v1/sandboxes", "", nil, http.StatusUnauthorized},
		{"api read with cookie", "GET", "/v1/sandboxes", sess, nil, http.StatusOK},
		{"api change with cookie and csrf", "POST", "/v1/sandboxes/abc/pause", sess, map[string]string{CSRFHeader: csrf, "Sec-Fetch-Site": "same-origin"}, http.StatusOK},
		{"api change without csrf", "POST", "/v1/sandboxes/abc/pause", sess, map[string]string{"Sec-Fetch-Site": "same-origin"}, http.StatusForbidden},
		{"api change with a wrong csrf", "DELETE", "/v1/sandboxes/abc", sess, map[string]string{CSRFHeader: "x", "Sec-Fetch-Site": "same-origin"}, http.StatusForbidden},
		{"cross-site form post", "POST", "/v1/sandboxes/abc/pause", sess, map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.test"}, http.StatusForbidden},
		{"cross-site post with the csrf token", "POST", "/v1/sandboxes/abc/pause", sess, map[string]string{CSRFHeader: csrf, "Sec-Fetch-Site": "same-site", "Origin": "http://evil.paddock.test"}, http.StatusForbidden},
		{"other origin without fetch metadata", "POST", "/v1/sandboxes/abc/pause", sess, map[string]string{CSRFHeader: csrf, "Origin": "http://evil.test"}, http.StatusForbidden},
		{"cookie never opens a sandbox's port", "GET", "/v1/sandboxes/abc/ports/3000/x", sess, nil, http.StatusUnauthorized},
		{"cookie never opens an upgrade", "GET", "/v1/lane", sess, map[string]string{"Upgrade": "paddock-lane", "Connection": "Upgrade"}, http.StatusUnauthorized},
		{"cookie never opens /metrics", "GET", "/metrics", sess, nil, http.StatusUnauthorized},
		{"bearer token still works", "POST", "/v1/sandboxes/abc/pause", "", map[string]string{"Authorization": "Bearer " + token}, http.StatusOK},
		{"logout without csrf", "POST", "/ui/logout", sess, nil, http.StatusForbidden},
		{"logout", "POST", "/ui/logout", sess, map[string]string{CSRFHeader: csrf}, http.StatusSeeOther},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, "http://paddock.test"+tc.path, nil)
			if tc.cookie != "" {
				r.AddCookie(&http.Cookie{Name: CookieName, Value: tc.cookie})
			}
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("got %d, want %d: %s", w.Code, tc.want, w.Body)
			}
		})
	}
}

func TestLoginRefusals(t *testing.T) {
	h, _ := newTest(t)
	for _, tc := range []struct {
		name, token string
		headers     map[string]string
		wantCookie  bool
		want        int
	}{
		{"right token", token, nil, true, http.StatusSeeOther},
		{"wrong token", "nope", nil, false, http.StatusSeeOther},
		{"cross-site login", token, map[string]string{"Sec-Fetch-Site": "cross-site"}, false, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "http://paddock.test/ui/login", strings.NewReader(url.Values{"token": {tc.token}}.Encode()))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("got %d, want %d", w.Code, tc.want)
			}
			if got := len(w.Result().Cookies()) > 0; got != tc.wantCookie {
				t.Fatalf("cookie set: %v, want %v", got, tc.wantCookie)
			}
		})
	}
}

func TestSessionExpiry(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := sessions{token: token, now: func() time.Time { return now }}
	v := s.issue()
	if !s.valid(v) {
		t.Fatal("a fresh session is invalid")
	}
	if other := (sessions{token: "another", now: s.now}); other.valid(v) {
		t.Fatal("a session of one token is valid for another")
	}
	now = now.Add(sessionTTL + time.Second)
	if s.valid(v) {
		t.Fatal("an expired session is valid")
	}
	for _, bad := range []string{"", ".", "x.y", "99999999999999999999.a", v + "x"} {
		if s.valid(bad) {
			t.Errorf("%q is valid", bad)
		}
	}
}
