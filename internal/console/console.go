// Package console owns the web console (/ui/): its login and session
// cookie, the CSRF checks of cookie-authenticated requests, the page and
// its bundled scripts, and the terminal's WebSocket. It is an adapter: the
// page speaks the daemon's /v1 API (its cookie stands in for the bearer
// token), and the terminal is an exec stream of the daemon's own client.
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/connlimit"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Config is one listener's console.
type Config struct {
	// Token is the listener's bearer token; "" (a unix socket) needs no
	// login.
	Token string
	// Client is the daemon's own client, for the terminal; nil: no
	// terminal.
	Client *client.Client
	Log    *slog.Logger
}

// Console serves /ui/ and lets its session cookie stand in for the token
// on the /v1 API.
type Console struct {
	sess   sessions
	client *client.Client
	log    *slog.Logger
	mux    *http.ServeMux
	assets map[string]asset
}

//go:embed page
var pageFS embed.FS

var pages = template.Must(template.ParseFS(pageFS, "page/*.html"))

// New returns the console of one listener.
func New(cfg Config) *Console {
	c := &Console{sess: sessions{token: cfg.Token, now: time.Now}, client: cfg.Client, log: cfg.Log, mux: http.NewServeMux(),
		assets: assets()}
	c.mux.HandleFunc("GET /ui/login", c.loginPage)
	c.mux.HandleFunc("POST /ui/login", c.login)
	c.mux.HandleFunc("GET /ui/login.css", c.staticPage("login.css"))
	c.mux.HandleFunc("POST /ui/logout", c.logout)
	c.mux.Handle("GET /ui/{$}", c.auth(http.HandlerFunc(c.index)))
	c.mux.Handle("GET /ui/sandboxes/{id}", c.auth(http.HandlerFunc(c.index)))
	c.mux.Handle("GET /ui/assets/{file}", c.auth(http.HandlerFunc(c.asset)))
	c.mux.Handle("GET /ui/ws/terminal/{id}", c.auth(http.HandlerFunc(c.terminal)))
	c.mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := c.session(r); !ok {
			c.refuse(w, r)
			return
		}
		writeError(w, http.StatusNotFound, errdefs.ErrNotFound, "no such console page: "+r.URL.Path)
	})
	return c
}

// Wrap serves /ui/ and hands everything else to next (the API), with the
// console's cookie standing in for the bearer token on /v1 (never on a
// sandbox's proxied ports, upgrades, /mcp or /metrics) and stripped
// before next sees the request.
func (c *Console) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ui" {
			http.Redirect(w, r, "/ui/", http.StatusSeeOther)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/ui/") {
			c.serveUI(w, r)
			return
		}
		if c.sess.token != "" && r.Header.Get("Authorization") == "" && cookieAPI(r) {
			if v, ok := c.sess.fromRequest(r); ok {
				if !safe(r.Method) {
					if err := c.sess.checkChange(r, v); err != nil {
						writeError(w, http.StatusForbidden, errdefs.ErrDenied, err.Error())
						return
					}
				}
				r = withoutCookie(r)
				r.Header.Set("Authorization", "Bearer "+c.sess.token)
			}
		}
		next.ServeHTTP(w, withoutCookie(r))
	})
}

func (c *Console) serveUI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	c.mux.ServeHTTP(w, r)
}

// cookieAPI reports whether the cookie may stand in for the token on r:
// the /v1 API but not a sandbox's ports (whose pages would run on this
// origin) nor a connection upgrade (the console's only one is its
// terminal, under /ui/).
func cookieAPI(r *http.Request) bool {
	p := r.URL.Path
	if !strings.HasPrefix(p, "/v1/") || r.Header.Get("Upgrade") != "" {
		return false
	}
	if rest, ok := strings.CutPrefix(p, "/v1/sandboxes/"); ok {
		if _, sub, ok := strings.Cut(rest, "/"); ok && strings.HasPrefix(sub, "ports/") {
			return false
		}
	}
	return true
}

// session returns the request's session; any request has one on a
// listener without a token.
func (c *Console) session(r *http.Request) (string, bool) {
	if c.sess.token == "" {
		return "", true
	}
	return c.sess.fromRequest(r)
}

// auth serves next to requests with a session (and the CSRF token, if
// they change something); a page asked for without one goes to the login
// page, anything else is refused with 401.
func (c *Console) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, ok := c.session(r)
		if !ok {
			c.refuse(w, r)
			return
		}
		if !safe(r.Method) {
			if err := c.sess.checkChange(r, v); err != nil {
				writeError(w, http.StatusForbidden, errdefs.ErrDenied, err.Error())
				return
			}
		}
		connlimit.Authenticated(w, r)
		next.ServeHTTP(w, r)
	})
}

// refuse answers a request without a session: a browser navigating to a
// page is sent to the login page, anything else gets 401.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.Header.Get("Upgrade") == "" && strings.Contains(r.Header.Get("Accept"), "text/html") {
		http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="paddock"`)
	writeError(w, http.StatusUnauthorized, errdefs.ErrDenied, "log in at /ui/login, or send the bearer token")
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, ok := c.session(r); ok {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	c.render(w, "login.html", map[string]any{"Failed": r.URL.Query().Get("failed") != ""})
}

// login checks the token typed on the login page and sets the session
// cookie. A cross-origin post is refused: nobody may log a browser into
// their own session either.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if err := crossOrigin.Check(r); err != nil {
		writeError(w, http.StatusForbidden, errdefs.ErrDenied, errCSRF.Error())
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if c.sess.token == "" {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	if err := r.ParseForm(); err != nil || !c.sess.checkToken(strings.TrimSpace(r.PostForm.Get("token"))) {
		c.log.Info("console login refused", "remote", r.RemoteAddr)
		http.Redirect(w, r, "/ui/login?failed=1", http.StatusSeeOther)
		return
	}
	setCookie(w, r, c.sess.issue())
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

// logout is a plain form post (the page's button), so its CSRF token
// comes as a form field.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	v, ok := c.session(r)
	if !ok {
		c.refuse(w, r)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if r.ParseForm() == nil && r.Header.Get(CSRFHeader) == "" {
		r.Header.Set(CSRFHeader, r.PostForm.Get("csrf"))
	}
	if err := c.sess.checkChange(r, v); err != nil {
		writeError(w, http.StatusForbidden, errdefs.ErrDenied, err.Error())
		return
	}
	setCookie(w, r, "")
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// index is the page of every console route; its script draws the route.
func (c *Console) index(w http.ResponseWriter, r *http.Request) {
	v, _ := c.session(r)
	c.render(w, "index.html", map[string]any{"CSRF": c.sess.csrf(v), "Login": c.sess.token != ""})
}

func (c *Console) render(w http.ResponseWriter, name string, data any) {
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, name, data); err != nil {
		c.log.Error("rendering console page", "page", name, "err", err)
		writeError(w, http.StatusInternalServerError, errors.New("internal"), "rendering the page failed")
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b.Bytes())
}

func (c *Console) staticPage(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, pageFS, "page/"+name)
	}
}

// asset serves one file of the bundle (or of the fallback without one),
// with an ETag of its content: a browser revalidates app.js and app.css
// and keeps the chunks, whose names carry their hashes.
func (c *Console) asset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	a, ok := c.assets[name]
	if !ok {
		writeError(w, http.StatusNotFound, errdefs.ErrNotFound, "no such asset: "+name)
		return
	}
	if strings.HasPrefix(name, "chunk-") {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	w.Header().Set("ETag", a.etag)
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(a.data))
}

// asset is one file of the page's scripts and styles.
type asset struct {
	data []byte
	etag string
}

// writeError answers in the API's error format.
func writeError(w http.ResponseWriter, code int, category error, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(api.Error{Code: errdefs.Code(category), Message: msg})
}

// loadAssets reads the page's scripts and styles: the bundle under the
// consoleui tag, the fallback without it.
func loadAssets() map[string]asset {
	files, err := fs.ReadDir(bundle, bundleDir)
	if err != nil {
		panic(err) // the embed names the directory
	}
	m := map[string]asset{}
	for _, f := range files {
		b, err := fs.ReadFile(bundle, bundleDir+"/"+f.Name())
		if err != nil || f.IsDir() || strings.HasPrefix(f.Name(), ".") {
			continue
		}
		sum := sha256.Sum256(b)
		m[f.Name()] = asset{data: b, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
	}
	return m
}

// assets are read once: every listener's console shares them.
var assets = sync.OnceValue(loadAssets)
