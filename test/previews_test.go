package test

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/paddock-dev/paddock/api"
)

// get answers a GET of u with headers (name, value pairs) through hc.
func previewGet(t *testing.T, hc *http.Client, u string, headers ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPreviewURL (issue 26, bar 4): a dev server in a sandbox is reached
// through a preview URL on the daemon's TCP listener with its token (the
// URL's, then the cookie it set, or the header), and refused without it,
// with a wrong one, with another preview's, with the API's token, after
// its expiry and after its revocation; a WebSocket echo passes through;
// --public needs no token; previews survive a kill -9 of the daemon, are
// stored hashed, and go with the sandbox.
func TestPreviewURL(t *testing.T) {
	t.Parallel()
	addr := freeHostPort(t)
	apiToken := "api-" + randHex(16)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(apiToken), 0o600); err != nil {
		t.Fatal(err)
	}
	paddr := freeHostPort(t)
	d := StartDaemon(t, "--listen", "tcp://"+addr, "--token-file", tokFile, "--preview-listen", "tcp://"+paddr)
	id := d.Create(api.CreateRequest{})
	d.Sh(id, "mkdir -p /tmp/site/sub && echo hello-preview > /tmp/site/index.html && echo deeper > /tmp/site/sub/page.txt && cd /tmp/site && nohup python3 -m http.server 3000 --bind 127.0.0.1 >/tmp/site.log 2>&1 &")
	if r := d.run(id, "", "bash", "-c", `for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/3000) 2>/dev/null && exit 0; sleep 0.05; done; cat /tmp/site.log; exit 1`); r.ExitCode != 0 {
		t.Fatalf("http.server did not listen: %s", r)
	}
	d.startPortServer(id, "http", 3001, "ws")

	plain := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	full := strings.TrimSpace(d.MustCLI("port", id, "3000", "--url"))
	u, err := url.Parse(full)
	if err != nil || u.Host != paddr || !strings.HasPrefix(u.Path, "/preview/"+id+".") || u.Query().Get("paddock_token") == "" {
		t.Fatalf("preview URL %q", full)
	}
	token := u.Query().Get("paddock_token")
	base := "http://" + paddr + u.Path

	// With its token: in the URL (which sets a cookie), then the cookie alone, or the header.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Timeout: 10 * time.Second, Jar: jar}
	if code, body := previewGet(t, browser, full); code != 200 || !strings.Contains(body, "hello-preview") {
		t.Fatalf("the URL with its token: %d %s", code, body)
	}
	if code, body := previewGet(t, browser, base+"sub/page.txt"); code != 200 || !strings.Contains(body, "deeper") {
		t.Fatalf("a page with the cookie: %d %s", code, body)
	}
	if code, body := previewGet(t, plain, base+"sub/page.txt", "Paddock-Preview-Token", token); code != 200 || !strings.Contains(body, "deeper") {
		t.Fatalf("a page with the header: %d %s", code, body)
	}
	// Without it, or with any other key: refused.
	for _, tc := range []struct {
		what    string
		url     string
		headers []string
	}{
		{"no token", base, nil},
		{"a wrong token", base + "?paddock_token=" + strings.Repeat("A", len(token)), nil},
		{"the API's token", base, []string{"Authorization", "Bearer " + apiToken}},
		{"an unknown preview", "http://" + paddr + "/preview/" + id + ".0000000000000000/", []string{"Paddock-Preview-Token", token}},
	} {
		if code, body := previewGet(t, plain, tc.url, tc.headers...); code != 401 || strings.Contains(body, "hello-preview") {
			t.Errorf("%s: %d %s, want 401", tc.what, code, body)
		}
	}
	// The preview's token opens nothing of the API.
	if code, _ := previewGet(t, plain, "http://"+addr+"/v1/sandboxes", "Authorization", "Bearer "+token); code != 401 {
		t.Errorf("the preview's token on the API: %d, want 401", code)
	}
	// Previews and the API (and the console) never share an origin: the
	// API's listener serves no preview, the previews' serves no API.
	if code, body := previewGet(t, plain, "http://"+addr+u.Path, "Authorization", "Bearer "+apiToken, "Paddock-Preview-Token", token); code != 404 || strings.Contains(body, "hello-preview") {
		t.Errorf("a preview on the API's listener: %d %s, want 404", code, body)
	}
	for _, path := range []string{"/v1/sandboxes", "/ui/", "/mcp"} {
		if code, _ := previewGet(t, plain, "http://"+paddr+path, "Authorization", "Bearer "+apiToken); code != 404 {
			t.Errorf("%s on the previews' listener: %d, want 404", path, code)
		}
	}

	// A WebSocket echo through a preview of another port, whose token
	// the first preview's does not open.
	wsFull := strings.TrimSpace(d.MustCLI("port", id, "3001", "--url", "--expires", "10m"))
	wsURL, _ := url.Parse(wsFull)
	if code, _ := previewGet(t, plain, "http://"+paddr+wsURL.Path, "Paddock-Preview-Token", token); code != 401 {
		t.Errorf("port 3000's token on port 3001's preview: %d, want 401", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	wsURL.Scheme = "ws"
	wsURL.Path += "ws"
	ws, _, err := websocket.Dial(ctx, wsURL.String(), nil)
	if err != nil {
		t.Fatalf("WebSocket through the preview: %v", err)
	}
	for _, msg := range []string{"one", strings.Repeat("x", 5000)} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, got, err := ws.Read(ctx); err != nil || string(got) != msg {
			t.Fatalf("WebSocket echo: %q %v", got, err)
		}
	}
	ws.Close(websocket.StatusNormalClosure, "")

	// Expiry.
	short, _ := url.Parse(strings.TrimSpace(d.MustCLI("port", id, "3000", "--url", "--expires", "2s")))
	if code, _ := previewGet(t, plain, short.String()); code != 200 {
		t.Fatalf("a fresh short preview: %d", code)
	}
	time.Sleep(2500 * time.Millisecond)
	if code, _ := previewGet(t, plain, short.String()); code != 401 {
		t.Errorf("an expired preview: %d, want 401", code)
	}

	// Public: no token needed.
	pub := strings.TrimSpace(d.MustCLI("port", id, "3000", "--url", "--public"))
	if code, body := previewGet(t, plain, pub); strings.Contains(pub, "paddock_token") || code != 200 || !strings.Contains(body, "hello-preview") {
		t.Fatalf("a public preview %s: %d %s", pub, code, body)
	}

	// Stored hashed: the token is nowhere in the daemon's state.
	filepath.WalkDir(d.StateDir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || strings.Contains(p, "/storage") || strings.Contains(p, "/images/") {
			return nil
		}
		if fi, err := e.Info(); err != nil || !fi.Mode().IsRegular() || fi.Size() > 64<<20 {
			return nil // disk images
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(token)) {
			t.Errorf("%s holds the preview's token", p)
		}
		return nil
	})

	// A kill -9 of the daemon keeps them.
	d.Kill9()
	d.Start()
	if code, body := previewGet(t, plain, base, "Paddock-Preview-Token", token); code != 200 || !strings.Contains(body, "hello-preview") {
		t.Fatalf("after a restart: %d %s", code, body)
	}
	if list := d.MustCLI("port", id, "--urls"); strings.Count(list, "\n"+id+".") != 3 {
		t.Fatalf("paddock port --urls (want 3, the expired one gone):\n%s", list)
	}

	// Revocation.
	if out := d.MustCLI("port", id, "3000", "--revoke"); !strings.Contains(out, "revoked 2") {
		t.Fatalf("revoke: %s", out)
	}
	if code, _ := previewGet(t, plain, base, "Paddock-Preview-Token", token); code != 401 {
		t.Errorf("a revoked preview: %d, want 401", code)
	}
	// With the sandbox gone, its previews go.
	if code, _ := previewGet(t, plain, wsFull); code != 200 {
		t.Fatalf("port 3001's preview before the removal: %d", code)
	}
	d.MustCLI("rm", "-f", id)
	if code, _ := previewGet(t, plain, wsFull); code != 401 {
		t.Errorf("a removed sandbox's preview: %d, want 401", code)
	}
}

// TestPreviewNeedsItsListener: a daemon without --preview-listen
// refuses preview URLs, saying how to get them, rather than serving
// them on the API's (and the console's) origin.
func TestPreviewNeedsItsListener(t *testing.T) {
	t.Parallel()
	d := StartDaemon(t)
	id := d.Create(api.CreateRequest{})
	r := d.CLI("port", id, "3000", "--url")
	if r.Code == 0 || !strings.Contains(r.Stderr, "--preview-listen") {
		t.Fatalf("port --url without a preview listener: %+v", r)
	}
}

// TestPreviewHost (issue 26): with --preview-domain, a preview is served
// at the root of a host name of its own, PORT-PREVIEW.DOMAIN, so an app's
// absolute links and redirects work; its token is still needed (the
// URL's sets a cookie for that host alone), a host naming another port or
// preview is refused, expiry and revocation apply, WebSockets pass, and
// the API's listener serves no preview by any host name. The names are
// resolved to the preview listener by the test's own dialer.
func TestPreviewHost(t *testing.T) {
	t.Parallel()
	addr, paddr := freeHostPort(t), freeHostPort(t)
	apiToken := "api-" + randHex(16)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(apiToken), 0o600); err != nil {
		t.Fatal(err)
	}
	const domain = "previews.paddock.test"
	d := StartDaemon(t, "--listen", "tcp://"+addr, "--token-file", tokFile, "--preview-listen", "tcp://"+paddr, "--preview-domain", domain)
	id := d.Create(api.CreateRequest{})
	d.startPortServer(id, "http", 3000, "app")

	// Every name dials the listener the test means: the preview's, or
	// the API's for apiHost.
	const apiHost = "api." + domain
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		target := paddr
		if strings.HasPrefix(a, apiHost+":") {
			target = addr
		}
		return (&net.Dialer{}).DialContext(ctx, "tcp", target)
	}
	tr := &http.Transport{DialContext: dial}
	t.Cleanup(tr.CloseIdleConnections)
	plain := &http.Client{Timeout: 10 * time.Second, Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Timeout: 10 * time.Second, Transport: tr, Jar: jar}

	full := strings.TrimSpace(d.MustCLI("port", id, "3000", "--url"))
	u, err := url.Parse(full)
	_, pport, _ := net.SplitHostPort(paddr)
	if err != nil || !strings.HasPrefix(u.Hostname(), "3000-"+id+"-") || !strings.HasSuffix(u.Host, "."+domain+":"+pport) || u.Path != "/" || u.Query().Get("paddock_token") == "" {
		t.Fatalf("host preview URL %q", full)
	}
	token := u.Query().Get("paddock_token")
	root := "http://" + u.Host

	// The URL's token sets a cookie for this host alone (no Domain).
	req, _ := http.NewRequest("GET", full, nil)
	resp, err := plain.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if sc := resp.Header.Get("Set-Cookie"); resp.StatusCode != 200 || !strings.Contains(sc, "HttpOnly") || !strings.Contains(sc, "Path=/;") || strings.Contains(strings.ToLower(sc), "domain=") {
		t.Fatalf("first visit: %d, Set-Cookie %q", resp.StatusCode, sc)
	}
	if code, _ := previewGet(t, browser, full); code != 200 {
		t.Fatalf("the URL with its token: %d", code)
	}
	// Absolute paths are the app's own, at the root; the token never reaches it.
	code, body := previewGet(t, browser, root+"/static/app.js?v=1")
	if code != 200 {
		t.Fatalf("an absolute path with the cookie: %d %s", code, body)
	}
	if a := decodeApp(t, []byte(body)); a.Path != "/static/app.js?v=1" || a.Headers["x-forwarded-prefix"] != "" || strings.Contains(body, token) {
		t.Errorf("the app saw %+v", a)
	}
	if code, body := previewGet(t, plain, root+"/x", "Paddock-Preview-Token", token); code != 200 || decodeApp(t, []byte(body)).Path != "/x" {
		t.Errorf("with the header: %d %s", code, body)
	}
	// The app's redirects stay at the root.
	req, _ = http.NewRequest("GET", root+"/redirect", nil)
	req.Header.Set("Paddock-Preview-Token", token)
	if resp, err := plain.Do(req); err != nil || resp.StatusCode != 302 || resp.Header.Get("Location") != "/target?x=1" {
		t.Errorf("redirect: %v %+v", err, resp)
	} else {
		resp.Body.Close()
	}

	// Refused: no token, a wrong one, the API's, a host naming another
	// port or another preview, a name not under the domain.
	other := strings.Replace(u.Host, "3000-", "3001-", 1)
	unknown := "3000-" + id + "-0000000000000000." + domain + ":" + pport
	for _, tc := range []struct {
		what    string
		url     string
		headers []string
	}{
		{"no token", root + "/", nil},
		{"a wrong token", root + "/?paddock_token=" + strings.Repeat("A", len(token)), nil},
		{"the API's token", root + "/", []string{"Authorization", "Bearer " + apiToken}},
		{"another port's host", "http://" + other + "/", []string{"Paddock-Preview-Token", token}},
		{"an unknown preview", "http://" + unknown + "/", []string{"Paddock-Preview-Token", token}},
	} {
		if code, body := previewGet(t, plain, tc.url, tc.headers...); code != 401 || strings.Contains(body, `"name"`) {
			t.Errorf("%s: %d %s, want 401", tc.what, code, body)
		}
	}
	if code, _ := previewGet(t, plain, "http://elsewhere.test:"+pport+"/", "Paddock-Preview-Token", token); code != 404 {
		t.Errorf("a host outside the domain: %d, want 404", code)
	}
	// The API's listener serves no preview, whatever the Host says.
	req, _ = http.NewRequest("GET", "http://"+apiHost+":1/", nil)
	req.Host = u.Host
	req.Header.Set("Authorization", "Bearer "+apiToken)
	req.Header.Set("Paddock-Preview-Token", token)
	if resp, err := plain.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 && strings.Contains(string(b), `"name"`) {
			t.Errorf("the API's listener served the preview's host: %d %s", resp.StatusCode, b)
		}
	}
	// The list shows the host URLs.
	list := d.MustCLI("port", id, "--urls")
	if !strings.Contains(list, u.Host) {
		t.Errorf("paddock port --urls does not show the host URL:\n%s", list)
	}

	// A WebSocket echo through the host name.
	wsFull := strings.TrimSpace(d.MustCLI("port", id, "3000", "--url", "--expires", "10m"))
	wsURL, _ := url.Parse(wsFull)
	wsURL.Scheme, wsURL.Path = "ws", "/ws"
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, wsURL.String(), &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatalf("WebSocket through the host preview: %v", err)
	}
	for _, msg := range []string{"one", strings.Repeat("x", 5000)} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, got, err := ws.Read(ctx); err != nil || string(got) != msg {
			t.Fatalf("WebSocket echo: %q %v", got, err)
		}
	}
	ws.Close(websocket.StatusNormalClosure, "")

	// Expiry.
	short := strings.TrimSpace(d.MustCLI("port", id, "3000", "--url", "--expires", "2s"))
	if code, _ := previewGet(t, plain, short); code != 200 {
		t.Fatalf("a fresh short preview: %d", code)
	}
	time.Sleep(2500 * time.Millisecond)
	if code, _ := previewGet(t, plain, short); code != 401 {
		t.Errorf("an expired preview: %d, want 401", code)
	}
	// Revocation, of the cookie's preview too.
	d.MustCLI("port", id, "3000", "--revoke")
	if code, _ := previewGet(t, browser, root+"/static/app.js"); code != 401 {
		t.Errorf("a revoked preview with its cookie: %d, want 401", code)
	}
}
