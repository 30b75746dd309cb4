package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// CookieName is the console's session cookie.
const CookieName = "paddock_console"

// CSRFHeader carries the console's CSRF token on every request that
// changes something (the page reads it from its <meta name="csrf">).
const CSRFHeader = "X-Paddock-CSRF"

// sessionTTL is how long a login lasts.
const sessionTTL = 12 * time.Hour

// sessions issues and checks session values without keeping any state: a
// value is its issue time and an HMAC of it keyed by the listener's token,
// so a new token ends every session, and a restart ends none.
type sessions struct {
	token string
	now   func() time.Time
}

func (s sessions) mac(parts ...string) string {
	m := hmac.New(sha256.New, []byte(s.token))
	m.Write([]byte("paddock-console|" + strings.Join(parts, "|")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// issue returns a new session value.
func (s sessions) issue() string {
	t := strconv.FormatInt(s.now().Unix(), 10)
	return t + "." + s.mac("session", t)
}

// valid reports whether v is a session value this token issued that has
// not expired.
func (s sessions) valid(v string) bool {
	t, sum, ok := strings.Cut(v, ".")
	if !ok {
		return false
	}
	sec, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return false
	}
	age := s.now().Sub(time.Unix(sec, 0))
	if age < -time.Minute || age > sessionTTL {
		return false
	}
	return hmac.Equal([]byte(sum), []byte(s.mac("session", t)))
}

// csrf is the CSRF token of session v.
func (s sessions) csrf(v string) string { return s.mac("csrf", v) }

// checkToken compares a token typed on the login page with the listener's.
func (s sessions) checkToken(got string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(s.token)) == 1
}

// fromRequest returns the request's session value, if it holds a valid one.
func (s sessions) fromRequest(r *http.Request) (string, bool) {
	c, err := r.Cookie(CookieName)
	if err != nil || !s.valid(c.Value) {
		return "", false
	}
	return c.Value, true
}

var errCSRF = errors.New("cross-site request refused: a change needs the console's CSRF token from the same origin")

// crossOrigin refuses unsafe requests a browser sent from another origin
// (Sec-Fetch-Site, else Origin against Host).
var crossOrigin = http.NewCrossOriginProtection()

// checkChange checks a request that changes something and is
// authenticated by session v: same origin, and the session's CSRF token in
// CSRFHeader. A cross-site form post fails both.
func (s sessions) checkChange(r *http.Request, v string) error {
	if err := crossOrigin.Check(r); err != nil {
		return errCSRF
	}
	if !hmac.Equal([]byte(r.Header.Get(CSRFHeader)), []byte(s.csrf(v))) {
		return errCSRF
	}
	return nil
}

// safe reports whether a method changes nothing.
func safe(method string) bool {
	return method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions
}

// setCookie sets (or, with an empty value, clears) the session cookie.
func setCookie(w http.ResponseWriter, r *http.Request, v string) {
	c := &http.Cookie{Name: CookieName, Value: v, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, MaxAge: int(sessionTTL / time.Second)}
	if v == "" {
		c.MaxAge = -1
	}
	http.SetCookie(w, c)
}

// withoutCookie returns r without the console's cookie, so that it never
// reaches a handler beyond the console (a sandbox's port, proxied).
func withoutCookie(r *http.Request) *http.Request {
	cs := r.Cookies()
	found := false
	for _, c := range cs {
		if c.Name == CookieName {
			found = true
		}
	}
	if !found {
		return r
	}
	r = r.Clone(r.Context())
	r.Header.Del("Cookie")
	for _, c := range cs {
		if c.Name != CookieName {
			r.AddCookie(c)
		}
	}
	return r
}
