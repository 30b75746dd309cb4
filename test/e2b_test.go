package test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/e2b"
)

// e2bDaemon is a daemon serving the E2B facade on a loopback port, and
// the environment that points E2B SDKs at it.
type e2bDaemon struct {
	*Daemon
	URL    string
	APIKey string
}

func (e *e2bDaemon) env() []string {
	return append(os.Environ(), "E2B_API_KEY="+e.APIKey, "E2B_API_URL="+e.URL, "E2B_SANDBOX_URL="+e.URL, "E2B_TEST_DOMAIN="+e2bTestDomain)
}

func startE2BDaemon(t *testing.T, extra ...string) *e2bDaemon {
	t.Helper()
	token := randHex(24)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeHostPort(t)
	d := newDaemon(t, append([]string{"--token-file", tokFile, "--e2b-listen", "tcp://" + addr, "--e2b-domain", e2bTestDomain}, extra...)...)
	return &e2bDaemon{Daemon: d, URL: "http://" + addr, APIKey: e2b.APIKey(token)}
}

// e2bTestDomain is the facade's sandbox domain in tests: the clients send
// its host names to the facade's loopback address themselves.
const e2bTestDomain = "e2b.test"

// npmHarness installs test/e2b's pinned npm packages (once per lock file,
// into a cache directory) and returns the directory to run node in. It
// skips the test when node or npm is not installed.
func npmHarness(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s is not installed (apt-get install nodejs npm)", tool)
		}
	}
	lock, err := os.ReadFile("e2b/package-lock.json")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	dir := os.Getenv("PADDOCK_E2B_NPM_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "paddock-e2b-npm-"+hex.EncodeToString(sum[:6]))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"package.json", "package-lock.json", "scenarios.mjs"} {
		b, err := os.ReadFile(filepath.Join("e2b", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules/e2b/package.json")); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return dir
}

// runScenario runs one scenario of scenarios.mjs and returns its "info"
// lines as key → values.
func runScenario(t *testing.T, e *e2bDaemon, dir, name string) map[string][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "scenarios.mjs", name)
	cmd.Dir = dir
	cmd.Env = e.env()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("node scenarios.mjs %s:\n%s", name, out.String())
	if err != nil {
		t.Fatalf("scenario %s failed: %v", name, err)
	}
	if !strings.Contains(out.String(), "ok "+name+"\n") {
		t.Fatalf("scenario %s did not report ok", name)
	}
	info := map[string][]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.SplitN(line, " ", 3); len(f) == 3 && f[0] == "info" {
			info[f[1]] = append(info[f[1]], f[2])
		}
	}
	return info
}

// TestE2BSDK drives the facade with the unchanged npm e2b SDK.
func TestE2BSDK(t *testing.T) {
	dir := npmHarness(t)
	e := startE2BDaemon(t)
	ctx := context.Background()
	for _, name := range []string{"commands", "pty", "files", "bigfile", "lifecycle", "killed", "listing", "snapshots", "entries", "metadata", "network", "ingress"} {
		t.Run(name, func(t *testing.T) {
			info := runScenario(t, e, dir, name)
			// Every sandbox a scenario made is gone, through the native
			// API too.
			for _, id := range info["sandbox"] {
				if _, err := e.Client().Get(ctx, id); err == nil {
					t.Errorf("sandbox %s outlived its scenario", id)
				}
			}
		})
	}
}

// TestE2BSameSandbox checks that the facade and the native API share one
// manager: a sandbox made through either is seen and used through both.
func TestE2BSameSandbox(t *testing.T) {
	e := startE2BDaemon(t)
	ctx := context.Background()
	native, err := e.Client().Create(ctx, api.CreateRequest{Labels: map[string]string{"team": "infra"}})
	if err != nil {
		t.Fatal(err)
	}
	// The host image keeps no_new_privs; only base (E2B's sudo) drops it.
	if out, _, st := e.Exec(native.ID, "grep", "NoNewPrivs", "/proc/self/status"); st == nil || st.ExitCode != 0 || !strings.Contains(out, "NoNewPrivs:\t1") {
		t.Fatalf("host image's no_new_privs: %q %+v", out, st)
	}
	// Listed by the facade with its labels as metadata.
	ans := e2bCall(t, e, "GET", "/v2/sandboxes?metadata=team%3Dinfra", "")
	if ans.status != 200 || !strings.Contains(ans.body, `"sandboxID":"`+native.ID+`"`) || !strings.Contains(ans.body, `"team":"infra"`) {
		t.Fatalf("facade list: %d %s", ans.status, ans.body)
	}
	// A facade sandbox is a native sandbox of image base, with user's
	// home as its workdir and the E2B metadata among its labels.
	ans = e2bCall(t, e, "POST", "/sandboxes", `{"metadata":{"via":"e2b"}}`)
	if ans.status != 201 {
		t.Fatalf("create: %d %s", ans.status, ans.body)
	}
	id := jsonField(t, ans.body, "sandboxID")
	sb := e.get(id)
	if sb.Image != "base" || sb.Workdir != "/home/user" || sb.Labels["e2b.meta/via"] != "e2b" || sb.ExpiresAt == nil {
		t.Fatalf("native view of an E2B sandbox: %+v", sb)
	}
	if got := time.Until(*sb.ExpiresAt); got < 250*time.Second || got > 301*time.Second {
		t.Errorf("default E2B timeout: expires in %v, want about 300 s", got)
	}
	// Files written natively are read through envd.
	if _, err := e.Client().WriteFile(ctx, id, "/home/user/native.txt", strings.NewReader("from native"), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	token := jsonField(t, ans.body, "envdAccessToken")
	req, _ := http.NewRequest("GET", e.URL+"/files?path=native.txt", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("X-Access-Token", token)
	got := do(t, req)
	if got.status != 200 || got.body != "from native" {
		t.Fatalf("envd read of a native write: %d %q", got.status, got.body)
	}
	// A snapshot of it is a template: a sandbox made from it through the
	// facade starts with its files.
	snap, err := e.Client().Snapshot(ctx, id, api.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	from := e2bCall(t, e, "POST", "/v2/sandboxes", `{"templateID":"`+snap.ID+`"}`)
	if from.status != 201 || !strings.Contains(from.body, `"templateID":"`+snap.ID+`"`) {
		t.Fatalf("create from snapshot %s: %d %s", snap.ID, from.status, from.body)
	}
	fromID := jsonField(t, from.body, "sandboxID")
	if out, _, st := e.Exec(fromID, "cat", "/home/user/native.txt"); st == nil || out != "from native" {
		t.Fatalf("file in a sandbox made from the snapshot: %q %+v", out, st)
	}
	if ans := e2bCall(t, e, "DELETE", "/sandboxes/"+fromID, ""); ans.status != 204 {
		t.Fatalf("kill: %d %s", ans.status, ans.body)
	}
	// Another sandbox's token does not open this one.
	req.Header.Set("E2b-Sandbox-Id", native.ID)
	if got := do(t, req); got.status != 401 {
		t.Fatalf("a token used on another sandbox: %d %s", got.status, got.body)
	}
	// Killed natively: the facade reports it gone.
	if err := e.Client().Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if ans := e2bCall(t, e, "GET", "/sandboxes/"+id, ""); ans.status != 404 || !strings.Contains(ans.body, `"code":404`) {
		t.Fatalf("info after a native kill: %d %s", ans.status, ans.body)
	}
}

// TestE2BPython drives the same flows from Python's standard library.
func TestE2BPython(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("skipping: python3 is not installed")
	}
	e := startE2BDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "python3", "e2b/client.py", e.URL, e.APIKey).CombinedOutput()
	t.Logf("client.py:\n%s", out)
	if err != nil || !strings.Contains(string(out), "ok python\n") {
		t.Fatalf("client.py failed: %v", err)
	}
}

type e2bAnswer struct {
	status int
	body   string
}

func do(t *testing.T, req *http.Request) e2bAnswer {
	t.Helper()
	return doWith(t, http.DefaultClient, req)
}

func doWith(t *testing.T, hc *http.Client, req *http.Request) e2bAnswer {
	t.Helper()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return e2bAnswer{resp.StatusCode, b.String()}
}

func e2bCall(t *testing.T, e *e2bDaemon, method, path, body string) e2bAnswer {
	t.Helper()
	req, err := http.NewRequest(method, e.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-KEY", e.APIKey)
	req.Header.Set("Content-Type", "application/json")
	return do(t, req)
}

func jsonField(t *testing.T, body, field string) string {
	t.Helper()
	_, rest, ok := strings.Cut(body, `"`+field+`":"`)
	v, _, ok2 := strings.Cut(rest, `"`)
	if !ok || !ok2 || v == "" {
		t.Fatalf("no %s in %s", field, body)
	}
	return v
}

// TestE2BHostileInput sends what a confused or hostile client would: bad
// fields get a 400 naming them, paths stay inside the sandbox whatever
// links it holds, and a sandbox header never reaches past its sandbox.
func TestE2BHostileInput(t *testing.T) {
	e := startE2BDaemon(t)
	for _, tc := range []struct{ method, path, body, field string }{
		{"POST", "/sandboxes", `{"metadata":{"bad key!":"x"}}`, "metadata"},
		{"POST", "/sandboxes", `{"timeout":-5}`, "timeout"},
		{"POST", "/sandboxes", `{"timeout":"soon"}`, "timeout"},
		{"GET", "/v2/sandboxes?limit=0", "", "limit"},
		{"GET", "/v2/sandboxes?state=exploded", "", "state"},
	} {
		ans := e2bCall(t, e, tc.method, tc.path, tc.body)
		if ans.status != 400 || !strings.Contains(ans.body, `"code":400`) || !strings.Contains(ans.body, tc.field) {
			t.Errorf("%s %s %s: %d %s, want 400 naming %s", tc.method, tc.path, tc.body, ans.status, ans.body, tc.field)
		}
	}
	ans := e2bCall(t, e, "POST", "/sandboxes", `{}`)
	if ans.status != 201 {
		t.Fatalf("create: %d %s", ans.status, ans.body)
	}
	id, token := jsonField(t, ans.body, "sandboxID"), jsonField(t, ans.body, "envdAccessToken")
	envd := func(method, path, ctype, body string) e2bAnswer {
		req, _ := http.NewRequest(method, e.URL+path, strings.NewReader(body))
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("X-Access-Token", token)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		return do(t, req)
	}
	// A link to / inside the sandbox leads to the sandbox's root, not the
	// host's, for reads and for writes.
	e.Sh(id, "ln -s / /home/user/hostroot && ln -s /etc/shadow /home/user/shadow")
	marker := "e2b-hostile-" + randHex(6)
	for _, p := range []string{"hostroot/etc/shadow", "shadow", "../../etc/shadow"} {
		got := envd("GET", "/files?path="+p, "", "")
		if got.status != 200 || !strings.Contains(got.body, "user:*:") {
			t.Errorf("read %s: %d %.80q, want the sandbox's shadow", p, got.status, got.body)
		}
	}
	if got := envd("POST", "/files?path=hostroot/tmp/"+marker, "application/octet-stream", "x"); got.status != 200 {
		t.Fatalf("write through the link: %d %s", got.status, got.body)
	}
	if _, err := os.Stat("/tmp/" + marker); err == nil {
		os.Remove("/tmp/" + marker)
		t.Fatal("a write through a link in the sandbox reached the host's /tmp")
	}
	if out := e.Sh(id, "cat /tmp/"+marker); out != "x" {
		t.Fatalf("the write did not land in the sandbox's /tmp: %q", out)
	}
	// Bad envd input: a malformed message, a wrong content type, a NUL.
	if got := envd("POST", "/filesystem.Filesystem/Stat", "application/json", `{"path":`); got.status != 400 || !strings.Contains(got.body, "invalid_argument") {
		t.Errorf("malformed message: %d %s", got.status, got.body)
	}
	if got := envd("POST", "/filesystem.Filesystem/Stat", "application/proto", `x`); got.status != 400 {
		t.Errorf("binary codec: %d %s", got.status, got.body)
	}
	if got := envd("GET", "/files?path=a%00b", "", ""); got.status != 400 {
		t.Errorf("NUL in a path: %d %s", got.status, got.body)
	}
	if got := envd("POST", "/process.Process/SendSignal", "application/json", `{"process":{"pid":999999},"signal":"SIGNAL_SIGKILL"}`); got.status != 404 {
		t.Errorf("signal to no process: %d %s", got.status, got.body)
	}
	// Sandbox headers that name nothing, or something that is not an id:
	// another sandbox's token is a wrong token for them (the credentials
	// are checked before the id is looked up).
	for _, bad := range []string{"../../etc", "nosuchsandbox", strings.Repeat("a", 200)} {
		req, _ := http.NewRequest("GET", e.URL+"/files?path=x", nil)
		req.Header.Set("E2b-Sandbox-Id", bad)
		req.Header.Set("X-Access-Token", token)
		if got := do(t, req); got.status != 401 {
			t.Errorf("sandbox header %.20q: %d %s", bad, got.status, got.body)
		}
	}
}

// TestE2BTimeoutSurvivesRestart: an E2B sandbox's timeout, and the pause
// that autoPause makes of it, are the sandbox's record: a daemon killed
// with -9 and restarted before the timeout still pauses (autoPause) or
// removes (the default) the sandbox when it is up, as E2B would.
func TestE2BTimeoutSurvivesRestart(t *testing.T) {
	t.Parallel()
	e := startE2BDaemon(t)
	create := func(body string) string {
		t.Helper()
		ans := e2bCall(t, e, "POST", "/sandboxes", body)
		if ans.status != 201 {
			t.Fatalf("create %s: %d %s", body, ans.status, ans.body)
		}
		return jsonField(t, ans.body, "sandboxID")
	}
	const timeout = 10 * time.Second
	start := time.Now()
	paused := create(`{"timeout":10,"autoPause":true}`)
	killed := create(`{"timeout":10}`)
	e.Sh(paused, "echo kept >/home/user/kept.txt")
	if sb := e.get(paused); sb.OnTimeout != api.TimeoutPause || sb.ExpiresAt == nil {
		t.Fatalf("record of an autoPause sandbox: on_timeout %q expires_at %v", sb.OnTimeout, sb.ExpiresAt)
	}

	token := jsonField(t, e2bCall(t, e, "GET", "/sandboxes/"+paused, "").body, "envdAccessToken")

	e.Kill9()
	e.Start()
	if time.Since(start) > timeout-2*time.Second {
		t.Skipf("the restart took %v: too close to the %v timeout to tell", time.Since(start), timeout)
	}
	for _, id := range []string{paused, killed} {
		if ans := e2bCall(t, e, "GET", "/sandboxes/"+id, ""); ans.status != 200 || !strings.Contains(ans.body, `"state":"running"`) {
			t.Fatalf("%s after the restart, before its timeout: %d %s", id, ans.status, ans.body)
		}
	}

	deadline := time.Now().Add(timeout + 20*time.Second)
	for {
		p := e2bCall(t, e, "GET", "/sandboxes/"+paused, "")
		k := e2bCall(t, e, "GET", "/sandboxes/"+killed, "")
		if strings.Contains(p.body, `"state":"paused"`) && k.status == 404 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after create: autoPause sandbox %d %s, want paused; default sandbox %d %s, want 404",
				time.Since(start).Round(time.Second), p.status, p.body, k.status, k.body)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if took := time.Since(start); took < timeout {
		t.Errorf("the timeout acted after %v, before its %v", took, timeout)
	}
	// Paused: no timeout left (E2B keeps it until killed or resumed);
	// connect resumes it with its files and a new timeout.
	if sb := e.get(paused); sb.ExpiresAt != nil {
		t.Errorf("a sandbox paused by its timeout still expires at %v", sb.ExpiresAt)
	}
	ans := e2bCall(t, e, "POST", "/sandboxes/"+paused+"/connect", `{"timeout":60}`)
	if ans.status != 201 {
		t.Fatalf("connect to resume: %d %s", ans.status, ans.body)
	}
	if got := jsonField(t, ans.body, "envdAccessToken"); got != token {
		t.Errorf("envd access token after the restart: %s, before: %s", got, token)
	}
	if out := e.Sh(paused, "cat /home/user/kept.txt"); out != "kept\n" {
		t.Errorf("file after the timeout's pause and a resume: %q", out)
	}
	if sb := e.get(paused); sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) > 61*time.Second {
		t.Errorf("timeout after connect: %v, want about 60 s", sb.ExpiresAt)
	}
}

// TestE2BSignedURLBinding: a signed /files URL allows the one operation,
// path and user it was signed for. Each attack here worked before the
// signature bound them: a user chosen by an Authorization header, a path
// chosen by multipart file names under a signature over no path, a
// second part riding on a signed path.
func TestE2BSignedURLBinding(t *testing.T) {
	e := startE2BDaemon(t)
	ans := e2bCall(t, e, "POST", "/sandboxes", `{}`)
	if ans.status != 201 {
		t.Fatalf("create: %d %s", ans.status, ans.body)
	}
	id, token := jsonField(t, ans.body, "sandboxID"), jsonField(t, ans.body, "envdAccessToken")
	signed := func(method, path, user string) string {
		raw := path + ":" + map[string]string{"GET": "read", "POST": "write"}[method] + ":" + user + ":" + token
		sum := sha256.Sum256([]byte(raw))
		q := url.Values{"signature": {"v1_" + base64.RawStdEncoding.EncodeToString(sum[:])}}
		if path != "" {
			q.Set("path", path)
		}
		if user != "" {
			q.Set("username", user)
		}
		return e.URL + "/files?" + q.Encode()
	}
	// upload posts a multipart body with the given file names and no
	// access token.
	upload := func(u, auth string, names ...string) e2bAnswer {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		for _, n := range names {
			fw, _ := mw.CreateFormFile("file", n)
			fw.Write([]byte("echo pwned\n"))
		}
		mw.Close()
		req, _ := http.NewRequest("POST", u, &body)
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		return do(t, req)
	}
	exists := func(p string) bool {
		_, _, st := e.Exec(id, "test", "-e", p)
		return st != nil && st.ExitCode == 0
	}
	root := "Basic " + base64.StdEncoding.EncodeToString([]byte("root:"))

	// A signature made without a user, used with root's Basic header.
	if got := upload(signed("POST", "notes.txt", ""), root, "notes.txt"); got.status != 401 || !strings.Contains(got.body, "user") {
		t.Errorf("default-user write signature with Authorization root: %d %s, want 401 naming the user", got.status, got.body)
	}
	if exists("/root/notes.txt") {
		t.Error("a write signed for the default user wrote /root/notes.txt")
	}
	// The same signature with no header writes as the default user.
	if got := upload(signed("POST", "notes.txt", ""), "", "notes.txt"); got.status != 200 || !strings.Contains(got.body, "/home/user/notes.txt") {
		t.Errorf("default-user write signature: %d %s", got.status, got.body)
	}
	if out := e.Sh(id, "stat -c %U /home/user/notes.txt"); out != "user\n" {
		t.Errorf("owner of a signed write: %q", out)
	}

	// A signature over no path, with the path in the part's file name.
	if got := upload(signed("POST", "", ""), "", "/etc/profile.d/zz.sh"); got.status != 401 || !strings.Contains(got.body, "path") {
		t.Errorf("write signature over no path: %d %s, want 401 naming the path", got.status, got.body)
	}
	if exists("/etc/profile.d/zz.sh") {
		t.Error("a signature over no path wrote /etc/profile.d/zz.sh")
	}

	// A signature over one path, with a second part named elsewhere.
	if got := upload(signed("POST", "one.txt", ""), "", "one.txt", "/etc/profile.d/zz2.sh"); got.status != 400 {
		t.Errorf("signed upload with a second part: %d %s, want 400", got.status, got.body)
	}
	if exists("/etc/profile.d/zz2.sh") {
		t.Error("a second part of a signed upload wrote /etc/profile.d/zz2.sh")
	}

	// A read signed for the default user does not read root's files.
	e.Sh(id, "echo secret >/root/r.txt && chmod 600 /root/r.txt")
	req, _ := http.NewRequest("GET", signed("GET", "/root/r.txt", ""), nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("Authorization", root)
	if got := do(t, req); got.status != 401 {
		t.Errorf("default-user read signature with Authorization root: %d %q, want 401", got.status, got.body)
	}
}

// TestE2BMetricsMatchNative: getMetrics shows the telemetry hub's
// samples, the ones /v1/sandboxes/{id}/metrics shows: the same times and
// the same numbers (cpuUsedPct is cpu_percent as a share of the
// sandbox's CPUs, E2B's unit).
func TestE2BMetricsMatchNative(t *testing.T) {
	e := startE2BDaemon(t)
	ans := e2bCall(t, e, "POST", "/sandboxes", `{}`)
	if ans.status != 201 {
		t.Fatalf("create: %d %s", ans.status, ans.body)
	}
	id := jsonField(t, ans.body, "sandboxID")
	start := time.Now()
	e.Sh(id, "head -c 30000000 /dev/zero >/home/user/fill; timeout 3 sh -c 'while :; do :; done'; true")

	type e2bMetric struct {
		Timestamp  time.Time `json:"timestamp"`
		CPUCount   int       `json:"cpuCount"`
		CPUUsedPct float64   `json:"cpuUsedPct"`
		MemUsed    int64     `json:"memUsed"`
		MemTotal   int64     `json:"memTotal"`
		DiskUsed   int64     `json:"diskUsed"`
		DiskTotal  int64     `json:"diskTotal"`
	}
	e2bMetrics := func(query string) []e2bMetric {
		t.Helper()
		ans := e2bCall(t, e, "GET", "/sandboxes/"+id+"/metrics"+query, "")
		var out []e2bMetric
		if ans.status != 200 || json.Unmarshal([]byte(ans.body), &out) != nil {
			t.Fatalf("getMetrics%s: %d %s", query, ans.status, ans.body)
		}
		return out
	}
	native := func() api.Metrics {
		t.Helper()
		var m api.Metrics
		if a := e.do("GET", "/v1/sandboxes/"+id+"/metrics?since=1m", ""); a.Status != 200 || json.Unmarshal(a.Body, &m) != nil {
			t.Fatalf("native metrics: %d %s", a.Status, a.Body)
		}
		return m
	}
	cpus := e.get(id).Resources.CPUs
	same := func(m e2bMetric, s api.Sample) {
		t.Helper()
		want := math.Min(100, s.CPUPercent/cpus)
		if !m.Timestamp.Equal(s.Time) || math.Abs(m.CPUUsedPct-want) > 1e-9 || m.MemUsed != s.MemoryBytes || m.MemTotal != s.MemoryLimitBytes ||
			m.DiskUsed != s.DiskUsedBytes || m.DiskTotal != s.DiskBytes {
			t.Errorf("E2B %+v; /v1 at %v: cpu_percent %g (÷ %g cpus = %g) memory %d/%d disk %d/%d",
				m, s.Time, s.CPUPercent, cpus, want, s.MemoryBytes, s.MemoryLimitBytes, s.DiskUsedBytes, s.DiskBytes)
		}
	}
	// Without a range: the latest sample, /v1's current one (asked again
	// if a sample was taken between the two calls).
	for try := 0; ; try++ {
		latest := e2bMetrics("")
		cur := native().Current
		if len(latest) != 1 || cur == nil {
			t.Fatalf("latest samples: E2B %+v, /v1 %+v", latest, cur)
		}
		if latest[0].Timestamp.Equal(cur.Time) || try == 10 {
			same(latest[0], *cur)
			break
		}
	}
	// With a range: /v1's history over it, sample for sample.
	ranged := e2bMetrics(fmt.Sprintf("?start=%d&end=%d", start.Unix()-1, time.Now().Unix()+1))
	byTime := map[int64]api.Sample{}
	for _, s := range native().History {
		byTime[s.Time.UnixNano()] = s
	}
	if len(ranged) < 2 {
		t.Fatalf("getMetrics over the last seconds: %d samples", len(ranged))
	}
	busy := false
	for _, m := range ranged {
		s, ok := byTime[m.Timestamp.UnixNano()]
		if !ok {
			t.Errorf("E2B sample at %v is not among /v1's samples", m.Timestamp)
			continue
		}
		same(m, s)
		busy = busy || m.CPUUsedPct > 1 // the host is shared: any use compares
	}
	if !busy {
		t.Errorf("no sample shows the busy loop: %+v", ranged)
	}
}

// testTLSCert makes a test CA and a server certificate it signs for
// e2bTestDomain and its subdomains (and 127.0.0.1), in dir: the CA, and
// the PEM files of the CA, the certificate and its key.
func testTLSCert(t *testing.T, dir string) (ca *x509.Certificate, caFile, certFile, keyFile string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: e2bTestDomain},
		DNSNames: []string{e2bTestDomain, "*." + e2bTestDomain}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(leafKey)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	caFile = filepath.Join(dir, "ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600)
	return ca, caFile, certFile, keyFile
}

// TestE2BIngressTLS serves the facade over TLS with a wildcard
// certificate (--e2b-tls-cert/--e2b-tls-key) and reaches a sandbox's
// envd and an app's port by host name through it, as E2B clients do at
// https://PORT-ID.DOMAIN.
func TestE2BIngressTLS(t *testing.T) {
	dir := t.TempDir()
	ca, _, certFile, keyFile := testTLSCert(t, dir)

	token := randHex(24)
	tokFile := filepath.Join(dir, "token")
	os.WriteFile(tokFile, []byte(token), 0o600)
	addr := freeHostPort(t)
	d := newDaemon(t, "--token-file", tokFile, "--e2b-listen", "tcp://"+addr, "--e2b-domain", e2bTestDomain,
		"--e2b-tls-cert", certFile, "--e2b-tls-key", keyFile)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	// Every name of the domain resolves to the facade, as wildcard DNS
	// would.
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	call := func(method, url string, hdr map[string]string, body string) e2bAnswer {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return doWith(t, hc, req)
	}
	ans := call("POST", "https://api."+e2bTestDomain+"/sandboxes", map[string]string{"X-API-KEY": e2b.APIKey(token)}, `{"templateID":"base"}`)
	if ans.status != 201 || jsonField(t, ans.body, "domain") != e2bTestDomain {
		t.Fatalf("create over TLS: %d %s", ans.status, ans.body)
	}
	id, envdToken := jsonField(t, ans.body, "sandboxID"), jsonField(t, ans.body, "envdAccessToken")
	defer d.Client().Delete(context.Background(), id, true)
	host := func(port int) string { return fmt.Sprintf("https://%d-%s.%s", port, id, e2bTestDomain) }
	if got := call("GET", host(49983)+"/health", map[string]string{"X-Access-Token": envdToken}, ""); got.status != 204 {
		t.Fatalf("envd by host name over TLS: %d %s", got.status, got.body)
	}
	if out, _, st := d.Exec(id, "sh", "-c", "mkdir -p /tmp/www && echo tls-ok > /tmp/www/index.html && cd /tmp/www && setsid -f python3 -m http.server 8000 >/dev/null 2>&1"); st == nil || st.ExitCode != 0 {
		t.Fatalf("starting the app: %q %+v", out, st)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := call("GET", host(8000)+"/index.html", nil, "")
		if got.status == 200 && got.body == "tls-ok\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("app by host name over TLS: %d %s", got.status, got.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := call("GET", host(8001), nil, ""); got.status != 502 || !strings.Contains(got.body, "port is not open") {
		t.Fatalf("closed port over TLS: %d %s", got.status, got.body)
	}
}

// TestE2BNetworkPrecedence: E2B's allowOut wins over its denyOut, through
// the npm SDK, against a host in a network namespace (nothing leaves the
// machine): the facade's policies are allow-first, the native API's stay
// deny-first.
func TestE2BNetworkPrecedence(t *testing.T) {
	dir := npmHarness(t)
	u := newUpstream(t, map[string]string{"allowed.test": "", "other.test": ""})
	e := startE2BDaemon(t, "--dns-upstream", u.DNS, "--egress-root-ca", u.CAFile)
	t.Setenv("E2B_UPSTREAM_IP", u.IP)
	t.Setenv("E2B_UPSTREAM_CA", u.CAFile)
	runScenario(t, e, dir, "precedence")
	if n := len(u.requests()); n < 4 {
		t.Errorf("the upstream saw %d requests, want the 4 allowed ones", n)
	}
	// The same policy through the native API keeps deny first.
	block := u.IP[:strings.LastIndexByte(u.IP, '.')] + ".0/24"
	id := e.Create(api.CreateRequest{Policy: &api.Policy{Presets: []string{"internet"}, Allow: []api.PolicyRule{{Match: "allowed.test"}}, Deny: []api.PolicyRule{{Match: block}}}})
	if r := curl(e.Daemon, id, "http://allowed.test/"); r.ExitCode == 0 && strings.Contains(r.Stdout, "hello from") {
		t.Fatalf("native deny-first let allowed.test through a denied block: %s", r)
	}
}
