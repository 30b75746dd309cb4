package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// groupYAML is a sandbox of three containers: a web server, a tools
// container on the base image, and a worker holding a secret, with a
// workspace the first two write and the worker reads.
const groupYAML = `
resources:
  memory_bytes: 536870912
shared_volumes:
  - name: workspace
containers:
  - name: web
    command: [python3, -m, http.server, "8123", --bind, 127.0.0.1, --directory, /workspace]
    mounts:
      - {name: workspace, path: /workspace}
  - name: tools
    image: base
    resources: {memory_bytes: 268435456}
    mounts:
      - {name: workspace, path: /workspace}
  - name: worker
    env: {WORKER_SECRET: s3cr3t}
    mounts:
      - {name: workspace, path: /workspace, read_only: true}
`

// groupExec runs cmd in container name of sandbox id through the SDK.
func (d *Daemon) groupExec(id, name string, cmd ...string) execResult {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb strings.Builder
	st, err := d.Client().Exec(client.WithContainer(ctx, name), id, api.ExecRequest{Cmd: cmd}, client.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil {
		d.t.Fatalf("exec %q in %s/%s: %v", cmd, id, name, err)
	}
	return execResult{Stdout: out.String(), Stderr: errb.String(), ExitStatus: st}
}

// TestContainers makes a sandbox of three containers from a sandbox.yaml
// and checks what they share (the network namespace, the workspace) and
// what they do not (processes, files, environment, uid ranges); then that
// they survive a daemon's kill -9, and that a removal leaves nothing.
func TestContainers(t *testing.T) {
	d := newDaemon(t)
	spec := filepath.Join(d.Root, "sandbox.yaml")
	if err := os.WriteFile(spec, []byte(groupYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	id := d.createCLI("-f", spec)
	sb := d.get(id)
	if len(sb.Containers) != 3 {
		t.Fatalf("sandbox has %d containers, want 3: %+v", len(sb.Containers), sb.Containers)
	}
	uids := map[uint32]string{}
	for _, c := range sb.Containers {
		if c.State != api.StateRunning || c.Runtime == nil || c.Runtime.HostPID == 0 {
			t.Fatalf("container %s: state %s runtime %+v, want running with a guest", c.Name, c.State, c.Runtime)
		}
		if other, dup := uids[c.Runtime.UIDBase]; dup {
			t.Fatalf("containers %s and %s share the uid range %d", other, c.Name, c.Runtime.UIDBase)
		}
		uids[c.Runtime.UIDBase] = c.Name
	}
	if sb.Containers[1].Image != "base" || sb.Containers[0].PID == 0 {
		t.Fatalf("containers: %+v", sb.Containers)
	}

	t.Run("exec in each", func(t *testing.T) {
		// The default is the first; -c names any.
		if out := d.MustCLI("exec", id, "--", "hostname"); strings.TrimSpace(out) != id {
			t.Fatalf("hostname without -c = %q, want %q", out, id)
		}
		for _, c := range []string{"web", "tools", "worker"} {
			// /etc/hostname too: the first container's is the sandbox's
			// (the gateway's file), the others' their own.
			out := d.MustCLI("exec", "-c", c, id, "--", "sh", "-c", "hostname; cat /etc/hostname")
			want := id + "--" + c
			if c == "web" {
				want = id
			}
			if out != want+"\n"+want+"\n" {
				t.Fatalf("hostname and /etc/hostname in %s = %q, want %q", c, out, want)
			}
		}
		if r := d.CLI("exec", "-c", "nope", id, "--", "true"); r.Code == 0 || !strings.Contains(r.Stderr, "nope") {
			t.Fatalf("exec in an unknown container: %+v", r)
		}
	})

	t.Run("localhost reaches another container", func(t *testing.T) {
		d.groupExec(id, "web", "sh", "-c", "echo hello-from-web > /workspace/index.txt")
		var got execResult
		ok := waitFor(20*time.Second, 200*time.Millisecond, func() bool {
			got = d.groupExec(id, "tools", "python3", "-c", "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8123/index.txt', timeout=2).read().decode())")
			return got.ExitCode == 0
		})
		if !ok || !strings.Contains(got.Stdout, "hello-from-web") {
			t.Fatalf("tools could not reach web's server on localhost: %s", got)
		}
	})

	t.Run("isolation", func(t *testing.T) {
		// Processes: the server runs in web, not visible from tools.
		ps := `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done`
		if out := d.groupExec(id, "web", "sh", "-c", ps); !strings.Contains(out.Stdout, "http.server") {
			t.Fatalf("web does not see its own server: %s", out)
		}
		for _, c := range []string{"tools", "worker"} {
			if out := d.groupExec(id, c, "sh", "-c", ps); strings.Contains(out.Stdout, "http.server") {
				t.Fatalf("%s sees web's processes:\n%s", c, out.Stdout)
			}
		}
		// Files outside the shared mounts.
		d.groupExec(id, "worker", "sh", "-c", "echo private > /root/key")
		if out := d.groupExec(id, "tools", "cat", "/root/key"); out.ExitCode == 0 {
			t.Fatalf("tools reads worker's /root/key: %s", out)
		}
		// Environment.
		if out := d.groupExec(id, "worker", "sh", "-c", "echo $WORKER_SECRET"); strings.TrimSpace(out.Stdout) != "s3cr3t" {
			t.Fatalf("worker's env: %s", out)
		}
		for _, c := range []string{"web", "tools"} {
			out := d.groupExec(id, c, "sh", "-c", "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
			if strings.Contains(out.Stdout, "s3cr3t") {
				t.Fatalf("%s sees worker's secret", c)
			}
		}
	})

	t.Run("shared volume", func(t *testing.T) {
		d.groupExec(id, "tools", "sh", "-c", "echo from-tools > /workspace/shared.txt")
		for _, c := range []string{"web", "worker"} {
			if out := d.groupExec(id, c, "cat", "/workspace/shared.txt"); strings.TrimSpace(out.Stdout) != "from-tools" {
				t.Fatalf("%s reads the workspace: %s", c, out)
			}
		}
		if out := d.groupExec(id, "worker", "sh", "-c", "echo x > /workspace/w"); out.ExitCode == 0 {
			t.Fatalf("worker wrote to its read-only workspace: %s", out)
		}
		// Files through the API address a container too.
		ctx := client.WithContainer(context.Background(), "tools")
		if _, err := d.Client().Stat(ctx, id, "/workspace/shared.txt"); err != nil {
			t.Fatalf("stat in tools: %v", err)
		}
		if _, err := d.Client().Stat(client.WithContainer(context.Background(), "worker"), id, "/root/key"); err != nil {
			t.Fatalf("stat in worker: %v", err)
		}
		if _, err := d.Client().Stat(context.Background(), id, "/root/key"); err == nil {
			t.Fatalf("the first container sees worker's /root/key")
		}
	})

	t.Run("ls and inspect", func(t *testing.T) {
		out := d.MustCLI("ls")
		if !strings.Contains(out, "CONTAINERS") || !strings.Contains(out, "tools(base):running") {
			t.Fatalf("ls: %s", out)
		}
		var got api.Sandbox
		if err := json.Unmarshal([]byte(d.MustCLI("inspect", id)), &got); err != nil {
			t.Fatal(err)
		}
		if len(got.Containers) != 3 || len(got.SharedVolumes) != 1 || got.SharedVolumes[0].Volume != id+"-workspace" {
			t.Fatalf("inspect: %+v %+v", got.Containers, got.SharedVolumes)
		}
	})

	t.Run("survives a daemon restart", func(t *testing.T) {
		before := d.get(id)
		d.Kill9()
		d.Start()
		after := d.get(id)
		for i, c := range after.Containers {
			if c.State != api.StateRunning || c.Runtime == nil || c.Runtime.HostPID != before.Containers[i].Runtime.HostPID {
				t.Fatalf("container %s after a restart: %+v %+v", c.Name, c, c.Runtime)
			}
		}
		if out := d.groupExec(id, "tools", "cat", "/workspace/shared.txt"); strings.TrimSpace(out.Stdout) != "from-tools" {
			t.Fatalf("tools after a restart: %s", out)
		}
	})

	t.Run("stop and resume", func(t *testing.T) {
		d.MustCLI("stop", id)
		for _, c := range d.get(id).Containers {
			if c.State != api.StateStopped {
				t.Fatalf("container %s of a stopped sandbox is %s", c.Name, c.State)
			}
		}
		d.MustCLI("resume", id)
		if out := d.groupExec(id, "worker", "cat", "/root/key"); strings.TrimSpace(out.Stdout) != "private" {
			t.Fatalf("worker's file after a resume: %s", out)
		}
		var got execResult
		ok := waitFor(20*time.Second, 200*time.Millisecond, func() bool {
			got = d.groupExec(id, "tools", "python3", "-c", "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8123/shared.txt', timeout=2).read().decode())")
			return got.ExitCode == 0
		})
		if !ok {
			t.Fatalf("web's command did not start again on resume: %s", got)
		}
	})

	t.Run("a container that ends", func(t *testing.T) {
		worker := d.get(id).Containers[2]
		if err := syscall.Kill(worker.Runtime.HostPID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		var got *api.Sandbox
		if !waitFor(10*time.Second, 50*time.Millisecond, func() bool {
			got = d.get(id)
			return got.Containers[2].State == api.StateStopped
		}) {
			t.Fatalf("worker after its guest was killed: %+v", got.Containers[2])
		}
		if got.State != api.StateRunning || got.Containers[2].Error == "" {
			t.Fatalf("sandbox %s, worker %+v: want the sandbox running and why the worker stopped", got.State, got.Containers[2])
		}
		if r := d.CLI("exec", "-c", "worker", id, "--", "true"); r.Code == 0 || !strings.Contains(r.Stderr, "worker") {
			t.Fatalf("exec in a stopped container: %+v", r)
		}
		if out := d.groupExec(id, "tools", "true"); out.ExitCode != 0 {
			t.Fatalf("tools after worker ended: %s", out)
		}
		events := d.MustCLI("events", id)
		if !strings.Contains(events, "container worker exited") {
			t.Fatalf("events do not say which container ended:\n%s", events)
		}
	})

	sb = d.get(id)
	d.MustCLI("rm", "-f", id)
	if left := d.traces(sb); len(left) > 0 {
		t.Fatalf("left after removal:\n%s", strings.Join(left, "\n"))
	}
	if vols := d.MustCLI("volume", "ls"); strings.Contains(vols, id) {
		t.Fatalf("the shared volume outlived its sandbox:\n%s", vols)
	}
}

// TestContainersRefused sends hostile specs: each is refused with an error
// naming the field, and nothing of any is left.
func TestContainersRefused(t *testing.T) {
	d := newDaemon(t)
	cases := []struct {
		name, body, field string
		status            int
	}{
		{"duplicate names", `{"containers":[{"name":"a"},{"name":"a"}]}`, "containers[1].name", 400},
		{"bad name", `{"containers":[{"name":"A_b"}]}`, "containers[0].name", 400},
		{"double dash", `{"containers":[{"name":"a--b"}]}`, "containers[0].name", 400},
		{"unknown image", `{"containers":[{"name":"a"},{"name":"b","image":"no-such-image"}]}`, "containers[1].image", 400},
		{"mount outside the root", `{"shared_volumes":[{"name":"w"}],"containers":[{"name":"a","mounts":[{"name":"w","path":"/proc/x"}]}]}`, "containers[0].mounts", 400},
		{"relative mount", `{"shared_volumes":[{"name":"w"}],"containers":[{"name":"a","mounts":[{"name":"w","path":"../w"}]}]}`, "containers[0].mounts", 400},
		{"limits above the sandbox's", `{"resources":{"memory_bytes":268435456},"containers":[{"name":"a"},{"name":"b","resources":{"memory_bytes":536870912}}]}`, "containers[1].resources.memory_bytes", 400},
		{"first container's limits", `{"containers":[{"name":"a","resources":{"pids":100}}]}`, "containers[0].resources", 400},
		{"image beside containers", `{"image":"host","containers":[{"name":"a"}]}`, "image", 400},
		{"shared volumes alone", `{"shared_volumes":[{"name":"w"}]}`, "shared_volumes", 400},
		{"unknown volume", `{"shared_volumes":[{"name":"w"}],"containers":[{"name":"a"},{"name":"b","mounts":[{"name":"nope","path":"/n"}]}]}`, "containers[1].mounts[0].name", 400},
		{"command that cannot start", `{"shared_volumes":[{"name":"w"}],"containers":[{"name":"a","mounts":[{"name":"w","path":"/w"}]},{"name":"b","command":["/no/such/binary"]}]}`, "container b", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := d.do(http.MethodPost, "/v1/sandboxes", tc.body)
			if a.Status < 400 || (tc.status != 0 && a.Status != tc.status) {
				t.Fatalf("status %d, want %d: %s", a.Status, tc.status, a.Body)
			}
			if e := a.apiError(t); !strings.Contains(e.Message, tc.field) {
				t.Fatalf("error %q does not name %q", e.Message, tc.field)
			}
		})
	}
	if list := d.MustCLI("ls", "-q"); strings.TrimSpace(list) != "" {
		t.Fatalf("refused creates left sandboxes: %s", list)
	}
	if vols := d.MustCLI("volume", "ls", "-q"); strings.TrimSpace(vols) != "" {
		t.Fatalf("refused creates left volumes: %s", vols)
	}
	if left := d.daemonTraces(); len(left) > 0 {
		t.Fatalf("refused creates left:\n%s", strings.Join(left, "\n"))
	}
	// The daemon still serves.
	id := d.Create(api.CreateRequest{})
	d.Sh(id, "true")
}

// controlYAML is a harness that drives its tools through its control
// socket, beside a database it may not drive, with a key only it holds.
const controlYAML = `
containers:
  - name: harness
    env: {MODEL_KEY: m0del-k3y}
    command: [sh, -c, "exec sleep 86400 # harness-marker"]
    controls: [tools]
  - name: tools
    image: base
  - name: db
    command: [sleep, "86400"]
`

// TestContainerControl is issue 24's bar 2 for the scoped credential: a
// harness with `controls: [tools]` drives tools through its control
// socket with the CLI (the Go SDK) from inside, and every attempt to
// reach anything else through it is refused; the tools container sees
// nothing of the harness.
func TestContainerControl(t *testing.T) {
	d := newDaemon(t)
	spec := filepath.Join(d.Root, "sandbox.yaml")
	if err := os.WriteFile(spec, []byte(controlYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	id := d.createCLI("-f", spec)
	other := d.Create(api.CreateRequest{})
	// The CLI inside the harness: the same binary.
	bin, err := os.Open(paddockBin)
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	if _, err := d.Client().WriteFile(context.Background(), id, "/root/paddock", bin, client.WriteOptions{Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	inHarness := func(script string) execResult {
		t.Helper()
		return d.groupExec(id, "harness", "sh", "-c", script)
	}

	t.Run("the harness drives tools", func(t *testing.T) {
		if out := inHarness(`echo "$PADDOCK_HOST $PADDOCK_SANDBOX"`); strings.TrimSpace(out.Stdout) != "unix://"+api.ControlSocket+" "+id {
			t.Fatalf("harness's environment: %s", out)
		}
		out := inHarness(`/root/paddock exec -c tools "$PADDOCK_SANDBOX" -- sh -c 'hostname; echo made > /root/made; echo err >&2; exit 3'`)
		if out.ExitCode != 3 || strings.TrimSpace(out.Stdout) != id+"--tools" || !strings.Contains(out.Stderr, "err") {
			t.Fatalf("exec in tools from the harness: %s", out)
		}
		if got := d.groupExec(id, "tools", "cat", "/root/made"); strings.TrimSpace(got.Stdout) != "made" {
			t.Fatalf("tools' file: %s", got)
		}
		// Files both ways, and processes watched.
		out = inHarness(`set -e; echo up > /tmp/up; P=/root/paddock; S=$PADDOCK_SANDBOX
			$P cp -c tools /tmp/up "$S:/root/up"; $P files cat -c tools "$S" /root/made
			$P exec -d -c tools "$S" -- sleep 300 > /tmp/pid; $P ps -c tools "$S"; $P kill -c tools "$S" "$(cat /tmp/pid)"`)
		if out.ExitCode != 0 || !strings.Contains(out.Stdout, "made") || !strings.Contains(out.Stdout, "sleep 300") {
			t.Fatalf("files and processes of tools from the harness: %s", out)
		}
		if got := d.groupExec(id, "tools", "cat", "/root/up"); strings.TrimSpace(got.Stdout) != "up" {
			t.Fatalf("the file the harness wrote in tools: %s", got)
		}
	})

	t.Run("refused", func(t *testing.T) {
		// Every route of the daemon's beside exec, processes and files,
		// and those too outside tools: refused (403), lanes 404.
		cases := []struct{ method, path, want string }{
			{"GET", "/v1/version", "403"},
			{"GET", "/v1/sandboxes", "403"},
			{"POST", "/v1/sandboxes", "403"},
			{"GET", "/v1/sandboxes/ID", "403"},
			{"DELETE", "/v1/sandboxes/ID?force=true", "403"},
			{"POST", "/v1/sandboxes/ID/stop", "403"},
			{"POST", "/v1/sandboxes/ID/pause", "403"},
			{"POST", "/v1/sandboxes/ID/freeze", "403"},
			{"POST", "/v1/sandboxes/ID/update", "403"},
			{"GET", "/v1/sandboxes/ID/policy", "403"},
			{"PUT", "/v1/sandboxes/ID/policy", "403"},
			{"GET", "/v1/sandboxes/ID/requests", "403"},
			{"GET", "/v1/requests", "403"},
			{"GET", "/v1/secrets", "403"},
			{"POST", "/v1/secrets", "403"},
			{"POST", "/v1/sandboxes/ID/snapshots", "403"},
			{"POST", "/v1/sandboxes/ID/fork", "403"},
			{"GET", "/v1/snapshots", "403"},
			{"GET", "/v1/volumes", "403"},
			{"GET", "/v1/images", "403"},
			{"GET", "/v1/templates", "403"},
			{"PUT", "/v1/pools", "403"},
			{"GET", "/v1/metrics", "403"},
			{"GET", "/v1/sandboxes/ID/metrics", "403"},
			{"GET", "/v1/sandboxes/ID/events", "403"},
			{"GET", "/v1/sandboxes/ID/logs", "403"},
			{"GET", "/v1/sandboxes/ID/ports", "403"},
			{"POST", "/v1/sandboxes/ID/previews", "403"},
			{"GET", "/mcp", "403"},
			{"GET", "/ui/", "403"},
			{"GET", "/v1/lane", "404"},
			{"GET", "/v1/sandboxes/ID/lane", "404"},
			// Exec, processes and files outside tools.
			{"POST", "/v1/sandboxes/ID/exec", "403"},                   // the first: the harness itself
			{"POST", "/v1/sandboxes/ID/exec?container=harness", "403"}, // its own container
			{"POST", "/v1/sandboxes/ID/exec?container=db", "403"},      // not one it controls
			{"GET", "/v1/sandboxes/ID/processes?container=db", "403"},
			{"GET", "/v1/sandboxes/ID/files?path=/etc/hostname&container=harness", "403"},
			{"POST", "/v1/sandboxes/OTHER/exec?container=tools", "403"}, // another sandbox
			{"GET", "/v1/sandboxes/OTHER/processes", "403"},
			{"GET", "/v1/sandboxes/OTHER/files?path=/etc/hostname", "403"},
			{"POST", "/v1/sandboxes/ID/../OTHER/exec", "400"},
			{"POST", "/v1/sandboxes/ID%2f..%2fOTHER/exec?container=tools", "400"},
			{"POST", "/v1/sandboxes/ID/exec?container=Tools", "400"},
			// And what it may do, for contrast.
			{"GET", "/v1/sandboxes/ID/processes?container=tools", "200"},
			{"GET", "/v1/sandboxes/ID/files/stat?path=/root/made&container=tools", "200"},
		}
		var script strings.Builder
		for _, c := range cases {
			path := strings.NewReplacer("OTHER", other, "ID", id).Replace(c.path)
			fmt.Fprintf(&script, "echo \"%s %s $(curl -s -o /dev/null -w '%%{http_code}' --path-as-is --unix-socket %s -X %s -H 'Content-Type: application/json' -d '{\"cmd\":[\"true\"]}' 'http://paddock%s')\"\n",
				c.method, path, api.ControlSocket, c.method, path)
		}
		out := inHarness(script.String())
		got := strings.Split(strings.TrimSpace(out.Stdout), "\n")
		if len(got) != len(cases) {
			t.Fatalf("%d answers for %d attempts: %s", len(got), len(cases), out)
		}
		for i, c := range cases {
			if f := strings.Fields(got[i]); f[len(f)-1] != c.want {
				t.Errorf("%s: status %s, want %s", got[i], f[len(f)-1], c.want)
			}
		}
		// The sandboxes are as they were.
		if sb := d.get(id); sb.State != api.StateRunning || sb.Policy != nil {
			t.Fatalf("sandbox after the attempts: %s %+v", sb.State, sb.Policy)
		}
		d.Sh(other, "true")
		// The CLI says why.
		r := inHarness(`/root/paddock exec -c db "$PADDOCK_SANDBOX" -- true; /root/paddock rm -f "$PADDOCK_SANDBOX"`)
		if !strings.Contains(r.Stderr, "does not control container db") || !strings.Contains(r.Stderr, "control socket serves only") {
			t.Fatalf("the CLI's refusals: %s", r)
		}
	})

	t.Run("tools sees nothing of the harness", func(t *testing.T) {
		harnessPID := d.get(id).Containers[0].Runtime.HostPID
		script := fmt.Sprintf(`for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; tr '\0' '\n' < $p/environ; done 2>/dev/null; env
			test -e %s && echo LEAK""ED-SOCKET; test -e /root/paddock && echo LEAK""ED-FILE
			head -c 16 /proc/%d/mem >/dev/null 2>&1 && echo LEAK""ED-MEM; cat /proc/%d/environ 2>/dev/null`, api.ControlSocket, harnessPID, harnessPID)
		out := d.groupExec(id, "tools", "sh", "-c", script)
		for _, leak := range []string{"harness-marker", "m0del-k3y", "PADDOCK_HOST", "LEAKED-SOCKET", "LEAKED-FILE", "LEAKED-MEM"} {
			if strings.Contains(out.Stdout, leak) {
				t.Errorf("tools sees %q of the harness:\n%s", leak, out.Stdout)
			}
		}
		// Nor does the harness's socket reach the harness itself, by
		// any name: it runs its own commands.
		if out := inHarness(`/root/paddock exec "$PADDOCK_SANDBOX" -- true`); out.ExitCode == 0 || !strings.Contains(out.Stderr, "holds this control socket") {
			t.Fatalf("the harness through its own socket: %s", out)
		}
	})

	t.Run("after a daemon restart", func(t *testing.T) {
		d.Kill9()
		d.Start()
		out := inHarness(`/root/paddock exec -c tools "$PADDOCK_SANDBOX" -- cat /root/made`)
		if strings.TrimSpace(out.Stdout) != "made" {
			t.Fatalf("the control socket after a restart: %s", out)
		}
	})

	d.MustCLI("rm", "-f", id)
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool {
		left, _ := os.ReadDir(filepath.Join(d.RunDir, "control"))
		return len(left) == 0
	}) {
		t.Fatalf("control sockets left after the removal")
	}
}

// TestContainerControlRefused: controls that name no other container
// are refused.
func TestContainerControlRefused(t *testing.T) {
	d := newDaemon(t)
	for _, tc := range []struct{ body, field string }{
		{`{"containers":[{"name":"a","controls":["a"]},{"name":"b"}]}`, "containers[0].controls[0]"},
		{`{"containers":[{"name":"a","controls":["c"]},{"name":"b"}]}`, "containers[0].controls[0]"},
		{`{"containers":[{"name":"a"},{"name":"b","controls":["a","a"]}]}`, "containers[1].controls[1]"},
	} {
		a := d.do(http.MethodPost, "/v1/sandboxes", tc.body)
		if e := a.apiError(t); a.Status != 400 || !strings.Contains(e.Message, tc.field) {
			t.Fatalf("%s: %d %s, want 400 naming %s", tc.body, a.Status, e.Message, tc.field)
		}
	}
}

// superviseYAML has readiness checks of both kinds, a command restarted
// on failure and one that fails for good.
const superviseYAML = `
containers:
  - name: app
    command: [sh, -c, "sleep 1; touch /tmp/ready; exec sleep 86400"]
    readiness: {exec: [test, -e, /tmp/ready], timeout_seconds: 30}
  - name: web
    command: [python3, -m, http.server, "8124", --bind, 127.0.0.1, --directory, /tmp]
    readiness: {http: "8124/", timeout_seconds: 30}
  - name: flaky
    command: [sh, -c, "echo boom; exit 3"]
    restart: on-failure
  - name: once
    command: [sh, -c, "echo last words; exit 7"]
`

// TestContainerSupervision: readiness checks gate create's answer (a
// timeout fails it and leaves nothing), restart policies restart a
// failing command with a backoff, and a command that fails for good
// leaves its container failed with its exit and last lines.
func TestContainerSupervision(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	spec := filepath.Join(d.Root, "sandbox.yaml")
	if err := os.WriteFile(spec, []byte(superviseYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	id := d.createCLI("-f", spec)
	// Ready when the create answered: no waiting here.
	if out := d.groupExec(id, "app", "test", "-e", "/tmp/ready"); out.ExitCode != 0 {
		t.Fatalf("app was not ready when the create answered: %s", out)
	}
	if out := d.groupExec(id, "app", "python3", "-c", "import urllib.request;urllib.request.urlopen('http://127.0.0.1:8124/', timeout=2)"); out.ExitCode != 0 {
		t.Fatalf("web was not ready when the create answered: %s", out)
	}
	var sb *api.Sandbox
	if !waitFor(20*time.Second, 100*time.Millisecond, func() bool {
		sb = d.get(id)
		return sb.Containers[2].Restarts >= 2 && sb.Containers[3].State == api.StateFailed
	}) {
		t.Fatalf("containers: %+v", sb.Containers)
	}
	flaky, once := sb.Containers[2], sb.Containers[3]
	if flaky.State != api.StateRunning || flaky.Exit == nil || flaky.Exit.ExitCode != 3 || !slices.Contains(flaky.LastLines, "boom") {
		t.Fatalf("flaky: %+v exit %+v", flaky, flaky.Exit)
	}
	if once.Exit == nil || once.Exit.ExitCode != 7 || !slices.Equal(once.LastLines, []string{"last words"}) || !strings.Contains(once.Error, "status 7") || once.Restarts != 0 {
		t.Fatalf("once: %+v exit %+v", once, once.Exit)
	}
	if sb.State != api.StateRunning || sb.Containers[0].State != api.StateRunning {
		t.Fatalf("sandbox %s, app %s: want both running", sb.State, sb.Containers[0].State)
	}
	// The backoff: 1 s, then 2 s between the restarts.
	time.Sleep(2 * time.Second)
	if n := d.get(id).Containers[2].Restarts; n > 4 {
		t.Fatalf("flaky restarted %d times in a few seconds: no backoff", n)
	}
	// inspect shows it.
	if out := d.MustCLI("inspect", id); !strings.Contains(out, `"last words"`) || !strings.Contains(out, `"restarts"`) {
		t.Fatalf("inspect: %s", out)
	}
	// A failed container can still be looked at.
	if out := d.groupExec(id, "once", "true"); out.ExitCode != 0 {
		t.Fatalf("exec in a failed container: %s", out)
	}
	d.MustCLI("rm", "-f", id)

	t.Run("not ready in time", func(t *testing.T) {
		for _, tc := range []struct{ body, says string }{
			{`{"containers":[{"name":"a"},{"name":"db","command":["sleep","600"],"readiness":{"exec":["false"],"timeout_seconds":2}}]}`, "container db is not ready after 2s: exec"},
			{`{"containers":[{"name":"a"},{"name":"db","command":["sleep","600"],"readiness":{"http":"5999/health","timeout_seconds":2}}]}`, "container db is not ready after 2s: GET localhost:5999/health"},
			{`{"containers":[{"name":"a"},{"name":"db","command":["sh","-c","echo cannot start; exit 4"],"readiness":{"exec":["false"],"timeout_seconds":20}}]}`, "exited with status 4; its last lines:\ncannot start"},
		} {
			start := time.Now()
			a := d.do(http.MethodPost, "/v1/sandboxes", tc.body)
			if e := a.apiError(t); a.Status != 503 || !strings.Contains(e.Message, tc.says) {
				t.Fatalf("%s: %d %q, want 503 saying %q", tc.body, a.Status, e.Message, tc.says)
			}
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("the create took %s", took)
			}
		}
		if list := d.MustCLI("ls", "-q"); strings.TrimSpace(list) != "" {
			t.Fatalf("failed creates left sandboxes: %s", list)
		}
		if left := d.daemonTraces(); len(left) > 0 {
			t.Fatalf("failed creates left:\n%s", strings.Join(left, "\n"))
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct{ body, field string }{
			{`{"containers":[{"name":"a","restart":"sometimes","command":["true"]}]}`, "containers[0].restart"},
			{`{"containers":[{"name":"a","restart":"always"}]}`, "containers[0].restart"},
			{`{"containers":[{"name":"a","readiness":{}}]}`, "containers[0].readiness"},
			{`{"containers":[{"name":"a","readiness":{"exec":["true"],"http":"80/"}}]}`, "containers[0].readiness"},
			{`{"containers":[{"name":"a","readiness":{"http":"99999/"}}]}`, "containers[0].readiness.http"},
			{`{"containers":[{"name":"a","readiness":{"exec":["true"],"timeout_seconds":-1}}]}`, "containers[0].readiness.timeout_seconds"},
		} {
			a := d.do(http.MethodPost, "/v1/sandboxes", tc.body)
			if e := a.apiError(t); a.Status != 400 || !strings.Contains(e.Message, tc.field) {
				t.Fatalf("%s: %d %q, want 400 naming %s", tc.body, a.Status, e.Message, tc.field)
			}
		}
	})
}
