package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/coder/websocket"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/console"
)

// consoleDaemon is a daemon with a TCP listener and a token, as a browser
// reaches one.
type consoleDaemon struct {
	*Daemon
	URL   string
	Token string
}

func startConsoleDaemon(t *testing.T) *consoleDaemon {
	t.Helper()
	token := randHex(16)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeHostPort(t)
	d := newDaemon(t, "--listen", "tcp://"+addr, "--token-file", tokFile)
	return &consoleDaemon{Daemon: d, URL: "http://" + addr, Token: token}
}

// browser starts a headless Chromium (Debian's chromium) for the test, or
// skips it when there is none.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skip("skipping: no chromium (apt-get install chromium; make test-deps)")
	}
	// Not t.TempDir: Chromium's helpers may still write there as the
	// test ends. Its TMPDIR is the profile too: Chromium leaves its
	// singleton's directory in TMPDIR when it is killed.
	profile, err := os.MkdirTemp("", "paddock-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900), chromedp.UserDataDir(profile), chromedp.Env("TMPDIR="+profile))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	// chromedp logs the events of newer Chromiums it does not know.
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(func(format string, args ...any) {
		if !strings.Contains(format, "unhandled") {
			t.Logf(format, args...)
		}
	}))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		for range 10 {
			if os.RemoveAll(profile) == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// run runs browser actions with a deadline, failing the test with what
// the page shows.
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Run(tctx, actions...); err != nil {
		var body, loc string
		sctx, c2 := context.WithTimeout(ctx, 5*time.Second)
		chromedp.Run(sctx, chromedp.Location(&loc), chromedp.Text("body", &body, chromedp.ByQuery))
		c2()
		t.Fatalf("%s: %v\nat %s:\n%.2000s", what, err, loc, body)
	}
}

// screenshot saves the page into PADDOCK_CONSOLE_SCREENSHOTS (docs/ when
// the README's pictures are refreshed), if set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("PADDOCK_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	var png []byte
	run(t, ctx, "screenshot", chromedp.FullScreenshot(&png, 100))
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func login(t *testing.T, ctx context.Context, d *consoleDaemon) {
	t.Helper()
	var loc string
	run(t, ctx, "login page", chromedp.Navigate(d.URL+"/ui/"), chromedp.WaitVisible("#token", chromedp.ByID), chromedp.Location(&loc))
	if !strings.HasSuffix(loc, "/ui/login") {
		t.Fatalf("without a session /ui/ went to %s, want the login page", loc)
	}
	run(t, ctx, "wrong token", chromedp.SendKeys("#token", "not-the-token", chromedp.ByID), chromedp.Click("#login", chromedp.ByID),
		chromedp.WaitVisible("#failed", chromedp.ByID))
	screenshot(t, ctx, "console-login.png")
	run(t, ctx, "log in", chromedp.SendKeys("#token", d.Token, chromedp.ByID), chromedp.Click("#login", chromedp.ByID),
		chromedp.WaitVisible("#sandboxes", chromedp.ByID))
}

// TestConsoleBrowser drives the web console in a real headless Chromium:
// log in, see a sandbox appear in the list and filter it, watch its chart
// update, run a command in its terminal, watch a process's output tail
// live, pause and resume it through the confirmations; and a cross-site
// form post with the session cookie is refused.
func TestConsoleBrowser(t *testing.T) {
	ctx := browser(t)
	d := startConsoleDaemon(t)
	login(t, ctx, d)

	id := d.Create(api.CreateRequest{Labels: map[string]string{"team": "console", "app": "demo"}})
	other := d.Create(api.CreateRequest{Labels: map[string]string{"team": "infra"}})
	row := fmt.Sprintf(`tr[data-id="%s"]`, id)
	run(t, ctx, "sandbox appears", chromedp.WaitVisible(row, chromedp.ByQuery),
		chromedp.WaitVisible(fmt.Sprintf(`tr[data-id="%s"]`, other), chromedp.ByQuery))
	if os.Getenv("PADDOCK_CONSOLE_SCREENSHOTS") != "" {
		// Something to draw for the pictures.
		d.Exec(id, "sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
		time.Sleep(3 * time.Second)
	}
	// Sparklines fill from the telemetry history.
	run(t, ctx, "sparklines", chromedp.WaitVisible(row+` svg.spark polyline`, chromedp.ByQuery))
	screenshot(t, ctx, "console-list.png")
	run(t, ctx, "label filter", chromedp.SendKeys("#label-filter", "team=infra", chromedp.ByID),
		chromedp.WaitNotVisible(row, chromedp.ByQuery))
	var count string
	run(t, ctx, "count", chromedp.Text("#count", &count, chromedp.ByID))
	if !strings.HasPrefix(count, "1 of ") {
		t.Errorf("filtered count %q, want 1 of N", count)
	}

	// The sandbox's page: its chart gains points as samples come in.
	run(t, ctx, "sandbox page", chromedp.Navigate(d.URL+"/ui/sandboxes/"+id), chromedp.WaitVisible("#sb-id", chromedp.ByID),
		chromedp.WaitVisible(`#chart[data-points]`, chromedp.ByQuery))
	var before string
	run(t, ctx, "chart points", chromedp.AttributeValue("#chart", "data-points", &before, nil, chromedp.ByID))
	run(t, ctx, "chart updates", chromedp.Poll(fmt.Sprintf(`Number(document.getElementById("chart").dataset.points) > %s`, before), nil,
		chromedp.WithPollingTimeout(10*time.Second)))

	// The terminal: a login shell on a PTY over the WebSocket.
	run(t, ctx, "open terminal", chromedp.Click("#open-terminal", chromedp.ByID), chromedp.WaitVisible(`#terminal[data-state="open"]`, chromedp.ByQuery))
	// Typed as text input (SendKeys' key events reach xterm twice).
	run(t, ctx, "type a command", chromedp.Focus("#terminal .xterm-helper-textarea", chromedp.ByQuery),
		input.InsertText("echo console-$((6*7)) && uname -s"), chromedp.KeyEvent(kb.Enter))
	run(t, ctx, "command output", chromedp.Poll(`document.querySelector("#terminal .xterm-rows").textContent.includes("console-42")`, nil,
		chromedp.WithPollingTimeout(10*time.Second)))

	// The exec log follows the newest process: a line cat echoes shows up
	// live.
	pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := d.Client().StartProcess(pctx, id, api.StartRequest{Cmd: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, ctx, "log follows the new process", chromedp.WaitVisible(fmt.Sprintf(`#logs li.on[data-pid="%d"]`, p.PID), chromedp.ByQuery))
	time.Sleep(300 * time.Millisecond) // the tail's request is under way
	sent := time.Now()
	if err := d.Client().SendInputBytes(pctx, id, p.PID, []byte("tail-line-1\n"), false); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, "live tail", chromedp.Poll(`document.getElementById("log-output").textContent.includes("tail-line-1")`, nil,
		chromedp.WithPollingInterval(10*time.Millisecond), chromedp.WithPollingTimeout(5*time.Second)))
	t.Logf("live tail: a line written showed %v later", time.Since(sent).Round(time.Millisecond))
	run(t, ctx, "events", chromedp.WaitVisible(`#events li.ev-exec`, chromedp.ByQuery))
	screenshot(t, ctx, "console-sandbox.png")

	// Pause and resume through their confirmations.
	run(t, ctx, "pause", chromedp.Click("#act-pause", chromedp.ByID), chromedp.WaitVisible("#confirm-ok", chromedp.ByID),
		chromedp.Click("#confirm-ok", chromedp.ByID), chromedp.WaitVisible("#act-resume", chromedp.ByID))
	if sb := d.get(id); sb.State != api.StatePaused {
		t.Fatalf("after the console's pause the sandbox is %s", sb.State)
	}
	run(t, ctx, "resume", chromedp.Click("#act-resume", chromedp.ByID), chromedp.WaitVisible("#confirm-ok", chromedp.ByID),
		chromedp.Click("#confirm-ok", chromedp.ByID), chromedp.WaitVisible("#act-pause", chromedp.ByID))
	if sb := d.get(id); sb.State != api.StateRunning {
		t.Fatalf("after the console's resume the sandbox is %s", sb.State)
	}

	// The sandbox asks for a host; a person approves it in the console,
	// and the audit names the console.
	code, answer := askFromInside(d.Daemon, id, "approve.test", "fetch the docs")
	var asked api.EgressRequest
	if err := json.Unmarshal([]byte(answer), &asked); code/100 != 2 || err != nil || asked.ID == "" {
		t.Fatalf("asking from inside: %d %s", code, answer)
	}
	req := fmt.Sprintf(`#requests tr[data-id="%s"]`, asked.ID)
	run(t, ctx, "request shows", chromedp.WaitVisible(req+`[data-state="pending"] button.approve`, chromedp.ByQuery))
	run(t, ctx, "approve", chromedp.Click(req+` button.approve`, chromedp.ByQuery), chromedp.WaitVisible("#confirm-ok", chromedp.ByID),
		chromedp.Click("#confirm-ok", chromedp.ByID), chromedp.WaitVisible(req+`[data-state="approved"]`, chromedp.ByQuery))
	got, err := d.Client().Requests(pctx, id, "")
	if err != nil || len(got) != 1 || got[0].State != api.RequestApproved || !strings.HasPrefix(got[0].DecidedBy, "console (") || got[0].Until == nil {
		t.Fatalf("after the console's approval: %+v %v", got, err)
	}

	// A cross-site form post carries the cookie (127.0.0.1 on another
	// port is the same site) and is refused.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id="f" method="post" action="%s/v1/sandboxes/%s/pause"></form><script>document.getElementById("f").submit()</script>`, d.URL, id)
	}))
	defer evil.Close()
	var body string
	run(t, ctx, "cross-site post", chromedp.Navigate(evil.URL), chromedp.WaitVisible("pre", chromedp.ByQuery),
		chromedp.Text("body", &body, chromedp.ByQuery))
	if !strings.Contains(body, "cross-site request refused") {
		t.Errorf("cross-site post answered %q", body)
	}
	if sb := d.get(id); sb.State != api.StateRunning {
		t.Fatalf("a cross-site post paused the sandbox (%s)", sb.State)
	}

	// The session cookie is HttpOnly and SameSite=Strict.
	var cookies []*network.Cookie
	run(t, ctx, "cookies", chromedp.ActionFunc(func(ctx context.Context) error {
		var err error
		cookies, err = network.GetCookies().WithURLs([]string{d.URL}).Do(ctx)
		return err
	}))
	found := false
	for _, c := range cookies {
		if c.Name == console.CookieName {
			found = true
			if !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict {
				t.Errorf("session cookie %+v: want HttpOnly and SameSite=Strict", c)
			}
		}
	}
	if !found {
		t.Error("no session cookie in the browser")
	}
}

// TestConsoleRefusesWithoutSession checks every console route, the
// terminal's WebSocket and the API without the cookie (401 or the login
// page), and the terminal's WebSocket from another origin with it.
func TestConsoleRefusesWithoutSession(t *testing.T) {
	d := startConsoleDaemon(t)
	consoleSession(t, d.URL, d.Token, d.Create(api.CreateRequest{}))
}

// consoleSession checks the console at base (a daemon's or a gateway's,
// its token token) with sandbox id: refused without a session, the
// terminal refused from another origin, and working from the console's.
func consoleSession(t *testing.T, base, token, id string) {
	t.Helper()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 10 * time.Second}
	for _, tc := range []struct{ method, path string }{
		{"GET", "/ui/"}, {"GET", "/ui/sandboxes/" + id}, {"GET", "/ui/assets/app.js"}, {"GET", "/ui/assets/app.css"},
		{"GET", "/ui/ws/terminal/" + id}, {"POST", "/ui/logout"}, {"GET", "/ui/whatever"},
		{"GET", "/v1/sandboxes"}, {"POST", "/v1/sandboxes/" + id + "/pause"}, {"DELETE", "/v1/sandboxes/" + id},
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, nil)
		req.Header.Set("Accept", "text/html")
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		redirected := resp.StatusCode == http.StatusSeeOther && resp.Header.Get("Location") == "/ui/login"
		if resp.StatusCode != http.StatusUnauthorized && !redirected {
			t.Errorf("%s %s without a session: %d %s", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(base, "http") + "/ui/ws/terminal/" + id
	if _, resp, err := websocket.Dial(ctx, wsURL, nil); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("terminal WebSocket without a session: %v %v", resp, err)
	}

	// With the session: the terminal works from the same origin, and is
	// refused from another.
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	resp, err := hc.PostForm(base+"/ui/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/ui/" {
		t.Fatalf("login ended at %d %s", resp.StatusCode, resp.Request.URL)
	}
	if code, body := previewGet(t, hc, base+"/v1/sandboxes/"+id); code != http.StatusOK || !strings.Contains(body, id) {
		t.Fatalf("the API with the session: %d %s", code, body)
	}
	if _, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: http.Header{"Origin": {"http://evil.test"}}}); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("terminal WebSocket from another origin: %v %v", resp, err)
	}
	conn, _, err := websocket.Dial(ctx, wsURL+"?cols=100&rows=30", &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatalf("terminal WebSocket with a session: %v", err)
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageBinary, []byte("stty size; exit 3\r")); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("terminal ended without an exit status: %v; output %q", err, out.String())
		}
		if typ == websocket.MessageText {
			if !strings.Contains(string(b), `"exit_code":3`) {
				t.Errorf("exit status %s, want exit_code 3", b)
			}
			break
		}
		out.Write(b)
	}
	if !strings.Contains(out.String(), "30 100") {
		t.Errorf("terminal output %q lacks the size 30 100", out.String())
	}
}
