package test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/mcp"
)

// mcpDaemon is a daemon with a TCP listener behind a token, whose /mcp
// serves the MCP streamable HTTP transport.
type mcpDaemon struct {
	*Daemon
	Addr  string
	Token string
}

func startMCPDaemon(t *testing.T) *mcpDaemon {
	t.Helper()
	token, tokFile, addr := randHex(24), filepath.Join(t.TempDir(), "token"), freeHostPort(t)
	if err := os.WriteFile(tokFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, "--listen", "tcp://"+addr, "--token-file", tokFile)
	return &mcpDaemon{Daemon: d, Addr: addr, Token: token}
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// mcpProgress collects the progress notifications a client receives.
type mcpProgress struct {
	mu    sync.Mutex
	n     int
	last  float64
	text  strings.Builder
	order bool // every notification's progress grew
}

func (p *mcpProgress) handle(_ context.Context, r *sdk.ProgressNotificationClientRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n > 0 && r.Params.Progress <= p.last {
		p.order = false
	}
	p.n++
	p.last = r.Params.Progress
	p.text.WriteString(strings.TrimPrefix(r.Params.Message, "stdout: "))
}

// mcpConnect connects the SDK's client over one of the three transports.
func mcpConnect(t *testing.T, d *mcpDaemon, how string, p *mcpProgress, args ...string) *sdk.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var tr sdk.Transport
	switch how {
	case "inprocess":
		s, err := mcp.New(mcp.Config{Client: d.Client()})
		if err != nil {
			t.Fatal(err)
		}
		st, ct := sdk.NewInMemoryTransports()
		ss, err := s.Connect(ctx, st, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ss.Close() })
		tr = ct
	case "stdio":
		cmd := exec.Command(paddockBin, append([]string{"--host", d.Host, "mcp"}, args...)...)
		cmd.Stderr = os.Stderr
		tr = &sdk.CommandTransport{Command: cmd}
	case "http":
		tr = &sdk.StreamableClientTransport{
			Endpoint:   "http://" + d.Addr + "/mcp",
			HTTPClient: &http.Client{Transport: bearer{d.Token, http.DefaultTransport}},
		}
	}
	return mcpOpen(t, how, tr, p)
}

// mcpOpen connects the SDK's client over tr (named how), its progress
// notifications collected in p (if not nil).
func mcpOpen(t *testing.T, how string, tr sdk.Transport, p *mcpProgress) *sdk.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := &sdk.ClientOptions{}
	if p != nil {
		p.order = true
		opts.ProgressNotificationHandler = p.handle
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "paddock-test"}, opts).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connecting over %s: %v", how, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// mcpCall calls a tool that must succeed and decodes its structured
// output into out.
func mcpCall(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, out any) {
	t.Helper()
	res := mcpCallResult(t, cs, name, args, nil)
	if res.IsError {
		t.Fatalf("%s(%v): tool error: %s", name, args, mcpText(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: decoding %s: %v", name, b, err)
		}
	}
}

func mcpCallResult(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, meta sdk.Meta) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	params := &sdk.CallToolParams{Name: name, Arguments: args}
	if meta != nil {
		params.Meta = meta
	}
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("%s(%v): %v", name, args, err)
	}
	return res
}

func mcpText(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestMCPSDK drives every tool with the SDK's own client over the three
// transports against a real daemon: in process, `paddock mcp` as a stdio
// subprocess, and the daemon's /mcp over HTTP with the token.
func TestMCPSDK(t *testing.T) {
	t.Parallel()
	d := startMCPDaemon(t)
	for _, how := range []string{"inprocess", "stdio", "http"} {
		t.Run(how, func(t *testing.T) {
			p := &mcpProgress{}
			cs := mcpConnect(t, d, how, p)
			mcpFlow(t, cs, p)
		})
	}
	t.Run("http-unauthenticated", func(t *testing.T) {
		for _, auth := range []string{"", "Bearer wrong-token-wrong-token"} {
			req, _ := http.NewRequest(http.MethodPost, "http://"+d.Addr+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("POST /mcp with %q: %d, want 401", auth, resp.StatusCode)
			}
		}
	})
}

func mcpFlow(t *testing.T, cs *sdk.ClientSession, p *mcpProgress) {
	var sb mcp.Sandbox
	mcpCall(t, cs, "create", map[string]any{"memory_mb": 256, "labels": map[string]string{"via": "mcp"}}, &sb)
	if sb.ID == "" || sb.State != "running" || sb.Memory != 256<<20 {
		t.Fatalf("create: %+v", sb)
	}

	var ex mcp.ExecOut
	mcpCall(t, cs, "exec", map[string]any{"sandbox": sb.ID, "cmd": []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, &ex)
	if ex.ExitCode != 3 || ex.Stdout != "out\n" || ex.Stderr != "err\n" {
		t.Fatalf("exec: %+v", ex)
	}
	mcpCall(t, cs, "exec", map[string]any{"sandbox": sb.ID, "cmd": []string{"sleep", "30"}, "timeout_seconds": 1}, &ex)
	if !ex.TimedOut {
		t.Fatalf("exec past its timeout: %+v", ex)
	}

	// Streamed output: seq 1 100000 is 588895 bytes.
	res := mcpCallResult(t, cs, "exec", map[string]any{"sandbox": sb.ID, "cmd": []string{"seq", "1", "100000"}}, sdk.Meta{"progressToken": "seq"})
	if res.IsError {
		t.Fatalf("exec seq: %s", mcpText(res))
	}
	// Notifications may trail the result on some transports.
	waitFor(5*time.Second, 20*time.Millisecond, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.last == 588895
	})
	p.mu.Lock()
	n, last, text, order := p.n, p.last, p.text.String(), p.order
	p.mu.Unlock()
	if n < 2 || last != 588895 || !order || !strings.HasPrefix(text, "1\n2\n3\n") || !strings.HasSuffix(text, "99999\n100000\n") {
		t.Fatalf("progress: %d notifications, last %v, in order %v, text %d bytes", n, last, order, len(text))
	}
	t.Logf("seq 1 100000: %d progress notifications", n)

	var fo mcp.FileOut
	mcpCall(t, cs, "write_file", map[string]any{"sandbox": sb.ID, "path": "/work/hello.txt", "content": "héllo\n", "mode": "0600"}, &fo)
	if fo.Size != 7 || fo.Mode != "0600" {
		t.Fatalf("write_file: %+v", fo)
	}
	mcpCall(t, cs, "write_file", map[string]any{"sandbox": sb.ID, "path": "/work/bin", "content": "AP8=", "encoding": "base64"}, nil)
	var rf mcp.ReadFileOut
	mcpCall(t, cs, "read_file", map[string]any{"sandbox": sb.ID, "path": "/work/hello.txt"}, &rf)
	if rf.Content != "héllo\n" || rf.Encoding != "utf-8" {
		t.Fatalf("read_file: %+v", rf)
	}
	mcpCall(t, cs, "read_file", map[string]any{"sandbox": sb.ID, "path": "/work/bin"}, &rf)
	if rf.Content != "AP8=" || rf.Encoding != "base64" {
		t.Fatalf("read_file of binary: %+v", rf)
	}
	var lf mcp.ListFilesOut
	mcpCall(t, cs, "list_files", map[string]any{"sandbox": sb.ID, "path": "/work"}, &lf)
	var names []string
	for _, f := range lf.Files {
		names = append(names, f.Path)
	}
	if !strings.Contains(strings.Join(names, " "), "/work/hello.txt") {
		t.Fatalf("list_files: %v", names)
	}
	res = mcpCallResult(t, cs, "read_file", map[string]any{"sandbox": sb.ID, "path": "/work/nope"}, nil)
	if !res.IsError || !strings.Contains(mcpText(res), "/work/nope") {
		t.Fatalf("read_file of a missing file: %v %s", res.IsError, mcpText(res))
	}
	mcpSearch(t, cs, sb.ID)

	var logs mcp.LogsOut
	mcpCall(t, cs, "logs", map[string]any{"sandbox": sb.ID}, &logs)
	var seqPID int
	for _, pr := range logs.Processes {
		if len(pr.Cmd) > 0 && pr.Cmd[0] == "seq" {
			seqPID = pr.PID
		}
	}
	if seqPID == 0 {
		t.Fatalf("logs: no seq in %+v", logs.Processes)
	}
	mcpCall(t, cs, "logs", map[string]any{"sandbox": sb.ID, "pid": seqPID, "tail_bytes": 13}, &logs)
	if logs.Output != "99999\n100000\n" {
		t.Fatalf("logs tail: %q", logs.Output)
	}

	var st mcp.StatsOut
	mcpCall(t, cs, "stats", map[string]any{"sandbox": sb.ID}, &st)
	if st.ID != sb.ID || st.State != "running" {
		t.Fatalf("stats: %+v", st)
	}
	var dn mcp.DenialsOut
	mcpCall(t, cs, "denials", map[string]any{"sandbox": sb.ID}, &dn)

	var done mcp.Done
	mcpCall(t, cs, "pause", map[string]any{"sandbox": sb.ID}, &done)
	if done.State != "paused" {
		t.Fatalf("pause: %+v", done)
	}
	mcpCall(t, cs, "resume", map[string]any{"sandbox": sb.ID}, &done)
	if done.State != "running" {
		t.Fatalf("resume: %+v", done)
	}
	var snap mcp.SnapshotOut
	mcpCall(t, cs, "snapshot", map[string]any{"sandbox": sb.ID}, &snap)
	var fromSnap mcp.Sandbox
	mcpCall(t, cs, "create", map[string]any{"from": snap.ID}, &fromSnap)
	mcpCall(t, cs, "read_file", map[string]any{"sandbox": fromSnap.ID, "path": "/work/hello.txt"}, &rf)
	if rf.Content != "héllo\n" {
		t.Fatalf("a sandbox from the snapshot reads %q", rf.Content)
	}
	var fk mcp.ForkOut
	mcpCall(t, cs, "fork", map[string]any{"sandbox": sb.ID}, &fk)
	if len(fk.Sandboxes) != 1 {
		t.Fatalf("fork: %+v", fk)
	}
	var ls mcp.ListOut
	mcpCall(t, cs, "list", map[string]any{"labels": map[string]string{"via": "mcp"}}, &ls)
	if len(ls.Sandboxes) < 2 {
		t.Fatalf("list by label: %+v", ls)
	}
	for _, id := range []string{fk.Sandboxes[0].ID, fromSnap.ID, sb.ID} {
		mcpCall(t, cs, "delete", map[string]any{"sandbox": id}, &done)
	}
	res = mcpCallResult(t, cs, "exec", map[string]any{"sandbox": sb.ID, "cmd": []string{"true"}}, nil)
	if !res.IsError || !strings.Contains(mcpText(res), sb.ID) {
		t.Fatalf("exec in a deleted sandbox: %v %s", res.IsError, mcpText(res))
	}
}

// TestMCPScoped: `paddock mcp --sandbox ID` serves that sandbox and
// refuses every other; no tool reads a secret's value or the token.
func TestMCPScoped(t *testing.T) {
	d := startMCPDaemon(t)
	ctx := context.Background()
	secret := "sk-" + randHex(16)
	if err := d.Client().CreateSecret(ctx, "API_KEY", secret); err != nil {
		t.Fatal(err)
	}
	mine := d.Create(api.CreateRequest{Env: map[string]string{"A": "1"}, Policy: &api.Policy{Secrets: []api.SecretBinding{{
		Name: "API_KEY", Hosts: []string{"api.example.com"}, Inject: api.SecretInjection{Header: "Authorization", Format: "Bearer %s"},
	}}}})
	other := d.Create(api.CreateRequest{})

	cs := mcpConnect(t, d, "stdio", nil, "--sandbox", mine)
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range tools.Tools {
		switch tl.Name {
		case "create", "delete", "fork", "list", "set_policy":
			t.Errorf("a scoped server offers %s", tl.Name)
		}
	}
	var ex mcp.ExecOut
	mcpCall(t, cs, "exec", map[string]any{"cmd": []string{"hostname"}}, &ex)
	if ex.ExitCode != 0 {
		t.Fatalf("exec in the served sandbox: %+v", ex)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"exec", map[string]any{"cmd": []string{"true"}}},
		{"read_file", map[string]any{"path": "/etc/hostname"}},
		{"write_file", map[string]any{"path": "/tmp/x", "content": "x"}},
		{"list_files", map[string]any{"path": "/"}},
		{"search_files", map[string]any{"name": "*"}},
		{"snapshot", nil}, {"pause", nil}, {"resume", nil}, {"logs", nil}, {"stats", nil}, {"denials", nil},
	} {
		args := map[string]any{"sandbox": other}
		for k, v := range tc.args {
			args[k] = v
		}
		res := mcpCallResult(t, cs, tc.tool, args, nil)
		if !res.IsError || !strings.Contains(mcpText(res), "outside this server's scope") {
			t.Errorf("%s on another sandbox: error %v %q", tc.tool, res.IsError, mcpText(res))
		}
	}
	if sb := d.get(other); sb.State != api.StateRunning {
		t.Fatalf("the other sandbox is %s", sb.State)
	}
	// Nothing the tools answer holds the secret or the daemon's token.
	var seen strings.Builder
	for _, call := range []struct {
		tool string
		args map[string]any
	}{
		{"exec", map[string]any{"cmd": []string{"sh", "-c", "env; cat /proc/1/environ"}}},
		{"stats", nil}, {"logs", nil}, {"denials", nil},
	} {
		res := mcpCallResult(t, cs, call.tool, call.args, nil)
		b, _ := json.Marshal(res)
		seen.Write(b)
	}
	if s := seen.String(); strings.Contains(s, secret) || strings.Contains(s, d.Token) {
		t.Fatalf("a tool answer holds the secret or the token")
	}
	if !strings.Contains(seen.String(), "PADDOCK_SECRET_API_KEY") {
		t.Fatalf("the sandbox does not see its secret's placeholder: the check above proves nothing")
	}
	// The policy stays as it was: no tool can widen it.
	pol, err := d.Client().Policy(ctx, mine)
	if err != nil {
		t.Fatal(err)
	}
	if len(pol.Allow) != 0 || len(pol.Presets) != 0 {
		t.Fatalf("policy widened: %+v", pol)
	}
}

// npmInstall installs the pinned npm packages of test/src (once per
// lock file, into a cache directory named for it) and returns the
// directory to run node in; marker is a package whose presence says the
// install is done. It skips the test when node or npm is not installed.
// The install goes to a fresh directory renamed into place, so that a
// killed run leaves no half-installed cache behind.
func npmInstall(t *testing.T, src, marker string) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s is not installed (apt-get install nodejs npm)", tool)
		}
	}
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	cache := filepath.Join(os.TempDir(), "paddock-npm-"+src+"-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(cache, "node_modules", marker, "package.json")); err == nil {
		return cache
	}
	fresh, err := os.MkdirTemp(os.TempDir(), "paddock-npm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(fresh)
	if err := os.CopyFS(fresh, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = fresh
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci of test/%s: %v\n%s", src, err, out)
	}
	os.RemoveAll(cache)
	if err := os.Rename(fresh, cache); err != nil {
		t.Fatal(err)
	}
	return cache
}

// TestMCPInspector: the MCP inspector's CLI mode, a real MCP client from
// npm, lists the tools over stdio and runs create → exec → read_file →
// delete over the daemon's /mcp.
func TestMCPInspector(t *testing.T) {
	dir := npmInstall(t, "mcp", "@modelcontextprotocol/inspector")
	d := startMCPDaemon(t)
	inspect := func(args ...string) map[string]any {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npx", append([]string{"--no-install", "@modelcontextprotocol/inspector", "--cli"}, args...)...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("inspector %v: %v\n%s\n%s", args, err, out, stderr)
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("inspector %v printed %s: %v", args, out, err)
		}
		return m
	}
	list := inspect(paddockBin, "--host", d.Host, "mcp", "--method", "tools/list")
	b, _ := json.Marshal(list)
	for _, name := range []string{`"create"`, `"exec"`, `"read_file"`, `"delete"`} {
		if !strings.Contains(string(b), name) {
			t.Fatalf("tools/list over stdio lacks %s: %s", name, b)
		}
	}
	http := func(tool string, args ...string) map[string]any {
		t.Helper()
		a := []string{"http://" + d.Addr + "/mcp", "--transport", "http", "--header", "Authorization: Bearer " + d.Token,
			"--method", "tools/call", "--tool-name", tool}
		for _, kv := range args {
			a = append(a, "--tool-arg", kv)
		}
		res := inspect(a...)
		if res["isError"] == true {
			t.Fatalf("%s: %v", tool, res)
		}
		sc, _ := res["structuredContent"].(map[string]any)
		if sc == nil {
			t.Fatalf("%s: no structured content: %v", tool, res)
		}
		return sc
	}
	id, _ := http("create")["id"].(string)
	if id == "" {
		t.Fatal("create gave no id")
	}
	ex := http("exec", "sandbox="+id, `cmd=["sh","-c","echo hi > /tmp/f; echo done"]`)
	if ex["stdout"] != "done\n" || ex["exit_code"] != float64(0) {
		t.Fatalf("exec: %v", ex)
	}
	if rf := http("read_file", "sandbox="+id, "path=/tmp/f"); rf["content"] != "hi\n" {
		t.Fatalf("read_file: %v", rf)
	}
	http("delete", "sandbox="+id)
	if _, err := d.Client().Get(context.Background(), id); err == nil {
		t.Fatal("the sandbox is still there after delete")
	}
}

// TestMCPPolicyChanges: allow rules and set_policy need a server started
// with --allow-policy-changes; with it they widen the policy and keep the
// sandbox's secret bindings.
func TestMCPPolicyChanges(t *testing.T) {
	d := startMCPDaemon(t)
	ctx := context.Background()

	cs := mcpConnect(t, d, "stdio", nil)
	res := mcpCallResult(t, cs, "create", map[string]any{"allow": []string{"example.com"}}, nil)
	if !res.IsError || !strings.Contains(mcpText(res), "--allow-policy-changes") {
		t.Fatalf("create with allow rules on a default server: %v %q", res.IsError, mcpText(res))
	}
	if _, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "set_policy", Arguments: map[string]any{"sandbox": "x"}}); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Fatalf("set_policy without --allow-policy-changes: %v, want an unknown tool", err)
	}

	if err := d.Client().CreateSecret(ctx, "K", "v-"+randHex(8)); err != nil {
		t.Fatal(err)
	}
	id := d.Create(api.CreateRequest{Policy: &api.Policy{Secrets: []api.SecretBinding{{
		Name: "K", Hosts: []string{"api.example.com"}, Inject: api.SecretInjection{Header: "X-Key", Format: "%s"},
	}}}})
	cs = mcpConnect(t, d, "stdio", nil, "--allow-policy-changes")
	var sb mcp.Sandbox
	mcpCall(t, cs, "create", map[string]any{"allow": []string{"example.com"}}, &sb)
	if pol, err := d.Client().Policy(ctx, sb.ID); err != nil || len(pol.Allow) != 1 || pol.Allow[0].Match != "example.com" {
		t.Fatalf("policy of a sandbox created with allow rules: %+v %v", pol, err)
	}
	var po mcp.PolicyOut
	mcpCall(t, cs, "set_policy", map[string]any{"sandbox": id, "allow": []string{"api.example.com"}}, &po)
	pol, err := d.Client().Policy(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(pol.Allow) != 1 || pol.Allow[0].Match != "api.example.com" || len(pol.Secrets) != 1 || pol.Secrets[0].Name != "K" {
		t.Fatalf("policy after set_policy: %+v", pol)
	}
	if len(po.Allow) != 1 || po.Allow[0] != "api.example.com" {
		t.Fatalf("set_policy answered %+v", po)
	}
}

// mcpSearch runs search_files in sandbox id: by name glob (on the name,
// or on the path below the root), by content (binary files skipped), with
// its bounds, and with paths that would leave the sandbox's root on the
// host (.., a symlink to /), which resolve inside it.
func mcpSearch(t *testing.T, cs *sdk.ClientSession, id string) {
	t.Helper()
	var ex mcp.ExecOut
	mcpCall(t, cs, "exec", map[string]any{"sandbox": id, "cmd": []string{"sh", "-c", `mkdir -p /work/s/src/sub &&
printf 'package a\n// needle here\n' > /work/s/src/a.go &&
printf 'x\nNeedle two\n' > /work/s/src/sub/b.go &&
printf 'needle\n' > /work/s/notes.txt &&
printf 'needle\0bin' > /work/s/blob &&
ln -s / /work/s/up && echo paddock-box > /etc/paddock-box`}}, &ex)
	if ex.ExitCode != 0 {
		t.Fatalf("making the tree: %+v", ex)
	}
	paths := func(o mcp.SearchFilesOut) string {
		var ps []string
		for _, m := range o.Matches {
			p := strings.TrimPrefix(m.Path, "/work/s/")
			if m.Line > 0 {
				p += fmt.Sprintf(":%d:%s", m.Line, m.Text)
			}
			ps = append(ps, p)
		}
		slices.Sort(ps)
		return strings.Join(ps, " ")
	}
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"name": "*.go"}, "src/a.go src/sub/b.go"},
		{map[string]any{"name": "src/*.go"}, "src/a.go"},
		{map[string]any{"content": "needle"}, "notes.txt:1:needle src/a.go:2:// needle here"},
		{map[string]any{"content": "needle", "ignore_case": true, "name": "*.go"}, "src/a.go:2:// needle here src/sub/b.go:2:Needle two"},
		{map[string]any{"name": "*.go", "depth": 1}, ""},
	} {
		args := map[string]any{"sandbox": id, "path": "/work/s"}
		for k, v := range tc.args {
			args[k] = v
		}
		var out mcp.SearchFilesOut
		mcpCall(t, cs, "search_files", args, &out)
		if got := paths(out); got != tc.want || out.Truncated {
			t.Errorf("search_files %v: %q (truncated %v), want %q", tc.args, got, out.Truncated, tc.want)
		}
	}
	var out mcp.SearchFilesOut
	mcpCall(t, cs, "search_files", map[string]any{"sandbox": id, "path": "/work/s", "content": "e", "max_results": 2}, &out)
	if len(out.Matches) != 2 || !out.Truncated || out.Stopped != "max_results" {
		t.Errorf("search_files bounded by max_results: %+v", out)
	}
	mcpCall(t, cs, "search_files", map[string]any{"sandbox": id, "path": "/work/s", "content": "needle", "max_bytes": 8}, &out)
	if !out.Truncated || out.Stopped != "max_bytes" || out.BytesRead > 8 {
		t.Errorf("search_files bounded by max_bytes: %+v", out)
	}
	// The sandbox's /etc, never the host's, whichever way the path goes.
	for _, root := range []string{"/../../../etc", "/work/s/up/etc"} {
		mcpCall(t, cs, "search_files", map[string]any{"sandbox": id, "path": root, "name": "paddock-box", "content": "paddock-box", "depth": 1}, &out)
		if len(out.Matches) != 1 || out.Matches[0].Text != "paddock-box" {
			t.Errorf("search_files under %s: %+v", root, out)
		}
	}
}
