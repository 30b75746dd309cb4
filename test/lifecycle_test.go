package test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

var idShape = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// TestRun covers `paddock run`: live output, the command's exit code, a
// clear line for a missing command, and no sandbox left afterwards.
func TestRun(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		// wantStderr, when set, must be the only stderr line's substring.
		wantStderr string
	}{
		{name: "echo", args: []string{"--", "echo", "hi"}, wantCode: 0, wantStdout: "hi\n"},
		{name: "exit code", args: []string{"--", "sh", "-c", "echo out; exit 7"}, wantCode: 7, wantStdout: "out\n"},
		{name: "missing command", args: []string{"--", "no-such-command-e2e"}, wantCode: 127, wantStderr: "no-such-command-e2e"},
		{name: "stderr passes through", args: []string{"--", "sh", "-c", "echo oops >&2"}, wantCode: 0, wantStderr: "oops"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := d.CLI(append([]string{"run"}, tt.args...)...)
			if r.Code != tt.wantCode {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", r.Code, tt.wantCode, r.Stdout, r.Stderr)
			}
			if tt.wantStdout != "" && r.Stdout != tt.wantStdout {
				t.Errorf("stdout %q, want %q", r.Stdout, tt.wantStdout)
			}
			if tt.wantStderr != "" {
				if l := lines(r.Stderr); len(l) != 1 || !strings.Contains(l[0], tt.wantStderr) {
					t.Errorf("stderr %q, want one line mentioning %q", r.Stderr, tt.wantStderr)
				}
			} else if r.Stderr != "" {
				t.Errorf("unexpected stderr %q", r.Stderr)
			}
			if ids := strings.TrimSpace(d.MustCLI("ls", "-q")); ids != "" {
				t.Errorf("run left sandboxes behind: %q", ids)
			}
			if left := d.daemonTraces(); len(left) > 0 {
				t.Errorf("run left traces behind: %v", left)
			}
		})
	}
}

// TestCLILifecycle drives create, exec, ls, inspect, stop and rm through
// the CLI, with every create flag.
func TestCLILifecycle(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.createCLI("--cpus", "0.5", "--memory", "256m", "--pids", "128", "--disk", "128m",
		"--env", "GREETING=hello world", "--env", "EMPTY=", "--workdir", "/tmp",
		"--label", "team=e2e", "--label", "run=lifecycle")
	if !idShape.MatchString(id) {
		t.Fatalf("create printed %q, not an id", id)
	}
	other := d.createCLI("--label", "team=other")

	t.Run("version", func(t *testing.T) {
		out := d.MustCLI("version")
		l := lines(out)
		if len(l) < 3 || !strings.HasPrefix(l[0], "client: ") || !strings.HasPrefix(l[1], "daemon: ") || strings.Contains(l[1], "unreachable") {
			t.Fatalf("version: %q, want a client and a reachable daemon line, then its runtimes", out)
		}
		for _, r := range l[2:] {
			if !strings.HasPrefix(r, "runtime ") {
				t.Errorf("version: line %q is not a runtime", r)
			}
		}
		if !slices.ContainsFunc(l[2:], func(r string) bool { return strings.HasPrefix(r, "runtime native: ") }) {
			t.Errorf("version: %q names no native runtime", out)
		}
	})

	t.Run("inspect", func(t *testing.T) {
		var sb api.Sandbox
		out := d.MustCLI("inspect", id)
		if err := json.Unmarshal([]byte(out), &sb); err != nil {
			t.Fatalf("inspect printed no JSON sandbox: %v\n%s", err, out)
		}
		want := api.Resources{CPUs: 0.5, MemoryBytes: 256 << 20, Pids: 128, DiskBytes: 128 << 20}
		if sb.ID != id || sb.State != api.StateRunning || sb.Resources != want {
			t.Errorf("inspect: id %q state %q resources %+v; want %q running %+v", sb.ID, sb.State, sb.Resources, id, want)
		}
		if sb.Env["GREETING"] != "hello world" || sb.Workdir != "/tmp" || sb.Image != "host" {
			t.Errorf("inspect: env %v workdir %q image %q", sb.Env, sb.Workdir, sb.Image)
		}
		if sb.Labels["team"] != "e2e" || sb.Labels["run"] != "lifecycle" || len(sb.Labels) != 2 {
			t.Errorf("inspect: labels %v", sb.Labels)
		}
		if sb.Runtime == nil || sb.Runtime.HostPID <= 0 {
			t.Errorf("inspect: no runtime host pid: %+v", sb.Runtime)
		}
	})

	t.Run("env and workdir", func(t *testing.T) {
		out := d.MustCLI("exec", id, "--", "sh", "-c", `pwd; echo "$GREETING"; echo "empty=[${EMPTY-unset}]"`)
		if want := "/tmp\nhello world\nempty=[]\n"; out != want {
			t.Errorf("got %q, want %q", out, want)
		}
		// exec's own flags override the sandbox's.
		out = d.MustCLI("exec", "-w", "/workspace", "-e", "GREETING=bye", id, "--", "sh", "-c", `pwd; echo "$GREETING"`)
		if want := "/workspace\nbye\n"; out != want {
			t.Errorf("with exec flags: got %q, want %q", out, want)
		}
	})

	t.Run("exec exit code", func(t *testing.T) {
		r := d.CLI("exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
		if r.Code != 3 || r.Stdout != "out\n" || r.Stderr != "err\n" {
			t.Errorf("exit %d stdout %q stderr %q; want 3, out, err", r.Code, r.Stdout, r.Stderr)
		}
	})

	t.Run("exec -i streams stdin", func(t *testing.T) {
		r := d.CLIInput("line one\nline two\n", "exec", "-i", id, "--", "cat")
		if r.Code != 0 || r.Stdout != "line one\nline two\n" {
			t.Errorf("exec -i cat: exit %d stdout %q stderr %q", r.Code, r.Stdout, r.Stderr)
		}
		// A larger input, to see it streamed and not truncated.
		big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
		sum := sha256.Sum256([]byte(big))
		r = d.CLIInput(big, "exec", "-i", id, "--", "sha256sum")
		if got := strings.Fields(r.Stdout); r.Code != 0 || len(got) == 0 || got[0] != hex.EncodeToString(sum[:]) {
			t.Errorf("exec -i sha256sum of 1 MiB: exit %d stdout %q stderr %q, want %x", r.Code, r.Stdout, r.Stderr, sum)
		}
	})

	t.Run("ls", func(t *testing.T) {
		table := d.MustCLI("ls")
		rows := lines(table)
		if len(rows) != 3 || !strings.HasPrefix(rows[0], "ID") {
			t.Fatalf("ls: want a header and two rows, got\n%s", table)
		}
		var row string
		for _, r := range rows[1:] {
			if strings.HasPrefix(r, id+" ") {
				row = r
			}
		}
		for _, want := range []string{"host", "running", "0.5", "256M", "128M", "run=lifecycle,team=e2e"} {
			if !strings.Contains(row, want) {
				t.Errorf("ls row for %s lacks %q: %q", id, want, row)
			}
		}

		var list []api.Sandbox
		if err := json.Unmarshal([]byte(d.MustCLI("ls", "--json")), &list); err != nil {
			t.Fatalf("ls --json: %v", err)
		}
		if len(list) != 2 {
			t.Errorf("ls --json: %d sandboxes, want 2", len(list))
		}

		idsOf := func(args ...string) []string {
			return strings.Fields(d.MustCLI(append([]string{"ls", "-q"}, args...)...))
		}
		if got := idsOf(); len(got) != 2 {
			t.Errorf("ls -q: %q, want 2 ids", got)
		}
		if got := idsOf("--label", "team=e2e"); len(got) != 1 || got[0] != id {
			t.Errorf("ls -q --label team=e2e: %q, want [%s]", got, id)
		}
		if got := idsOf("--label", "team=e2e", "--label", "run=other"); len(got) != 0 {
			t.Errorf("ls -q with two labels, one not matching: %q, want none", got)
		}
		if got := idsOf("--label", "team=nobody"); len(got) != 0 {
			t.Errorf("ls -q --label team=nobody: %q, want none", got)
		}
		if got := idsOf("--state", "running"); len(got) != 2 {
			t.Errorf("ls -q --state running: %q, want 2 ids", got)
		}
		if got := idsOf("--state", "stopped"); len(got) != 0 {
			t.Errorf("ls -q --state stopped: %q, want none", got)
		}
		if r := d.CLI("ls", "--state", "bogus"); r.Code == 0 || len(lines(r.Stderr)) != 1 || !strings.Contains(r.Stderr, "state") {
			t.Errorf("ls --state bogus: exit %d stderr %q; want an error naming the state", r.Code, r.Stderr)
		}
	})

	t.Run("rm of a running sandbox needs -f", func(t *testing.T) {
		r := d.CLI("rm", other)
		if r.Code == 0 {
			t.Fatalf("rm of a running sandbox succeeded without -f")
		}
		if l := lines(r.Stderr); len(l) != 1 || !strings.Contains(l[0], "running") {
			t.Errorf("rm without -f: stderr %q, want one line saying it is running", r.Stderr)
		}
		if d.get(other).State != api.StateRunning {
			t.Errorf("refused rm changed the sandbox's state")
		}
		if out := d.MustCLI("exec", other, "--", "echo", "still here"); out != "still here\n" {
			t.Errorf("sandbox after refused rm: %q", out)
		}
		sb := d.get(other)
		if out := d.MustCLI("rm", "-f", other); strings.TrimSpace(out) != other {
			t.Errorf("rm -f printed %q, want the id", out)
		}
		if r := d.CLI("inspect", other); r.Code == 0 || !strings.Contains(r.Stderr, "not found") {
			t.Errorf("inspect after rm -f: exit %d stderr %q", r.Code, r.Stderr)
		}
		if left := d.traces(sb); len(left) > 0 {
			t.Errorf("rm -f left traces: %v", left)
		}
	})

	t.Run("stop then exec", func(t *testing.T) {
		d.MustCLI("exec", id, "--", "sh", "-c", "echo kept > /workspace/kept")
		if out := d.MustCLI("stop", id); strings.TrimSpace(out) != id {
			t.Errorf("stop printed %q", out)
		}
		if st := d.get(id).State; st != api.StateStopped {
			t.Errorf("state after stop: %q, want stopped", st)
		}
		r := d.CLI("exec", id, "--", "true")
		if r.Code == 0 {
			t.Fatalf("exec in a stopped sandbox succeeded")
		}
		if l := lines(r.Stderr); len(l) != 1 || !strings.Contains(l[0], "stopped") {
			t.Errorf("exec in a stopped sandbox: stderr %q, want one line saying it is stopped", r.Stderr)
		}
		_, err := d.Client().Exec(context.Background(), id, api.ExecRequest{Cmd: []string{"true"}}, client.ExecIO{})
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusConflict {
			t.Errorf("SDK exec in a stopped sandbox: %v, want a 409", err)
		}
		if got := strings.Fields(d.MustCLI("ls", "-q", "--state", "stopped")); len(got) != 1 || got[0] != id {
			t.Errorf("ls -q --state stopped: %q, want [%s]", got, id)
		}
		// A stopped sandbox is removed without -f.
		d.MustCLI("rm", id)
		if ids := strings.TrimSpace(d.MustCLI("ls", "-q")); ids != "" {
			t.Errorf("ls -q after removing everything: %q", ids)
		}
	})

	t.Run("unknown id", func(t *testing.T) {
		for _, args := range [][]string{
			{"inspect", "nosuchbox"},
			{"exec", "nosuchbox", "--", "true"},
			{"rm", "nosuchbox"},
			{"rm", "-f", "nosuchbox"},
			{"stop", "nosuchbox"},
		} {
			r := d.CLI(args...)
			if r.Code == 0 {
				t.Errorf("paddock %s: exit 0", strings.Join(args, " "))
			}
			if l := lines(r.Stderr); len(l) != 1 || !strings.Contains(l[0], "not found") {
				t.Errorf("paddock %s: stderr %q, want one line with \"not found\"", strings.Join(args, " "), r.Stderr)
			}
		}
	})

	t.Run("bad flags", func(t *testing.T) {
		for _, args := range [][]string{
			{"create", "--memory", "lots"},
			{"create", "--memory", "1k"},
			{"create", "--cpus", "-1"},
			{"create", "--env", "NOEQUALS"},
			{"create", "--label", "=v"},
			{"create", "--workdir", "relative/dir"},
			{"run", "--timeout", "-5s", "--", "true"},
		} {
			r := d.CLI(args...)
			if r.Code == 0 {
				t.Errorf("paddock %s: exit 0", strings.Join(args, " "))
			}
			if l := lines(r.Stderr); len(l) != 1 {
				t.Errorf("paddock %s: stderr %q, want one line", strings.Join(args, " "), r.Stderr)
			}
		}
		if ids := strings.TrimSpace(d.MustCLI("ls", "-q")); ids != "" {
			t.Errorf("refused creates left sandboxes: %q", ids)
		}
	})
}

// TestWorkdirCreated: a workdir that does not exist yet is either made, as
// Docker does, or refused with an error that names it; it must not leave a
// sandbox where every exec fails with a misleading message.
func TestWorkdirCreated(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	r := d.CLI("run", "--workdir", "/workspace/new/dir", "--", "pwd")
	switch {
	case r.Code == 0:
		if r.Stdout != "/workspace/new/dir\n" {
			t.Errorf("pwd in a new workdir: %q", r.Stdout)
		}
	case !strings.Contains(r.Stderr, "workdir") && !strings.Contains(r.Stderr, "/workspace/new/dir"):
		t.Errorf("run --workdir /workspace/new/dir: exit %d, stderr %q names neither the workdir nor the flag", r.Code, r.Stderr)
	}
}

// TestTimeout: a sandbox with --timeout ends and is removed by itself.
func TestTimeout(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.createCLI("--timeout", "2s")
	sb := d.get(id)
	if sb.State != api.StateRunning || sb.ExpiresAt == nil {
		t.Fatalf("new sandbox with a timeout: state %q expires_at %v", sb.State, sb.ExpiresAt)
	}
	if until := time.Until(*sb.ExpiresAt); until <= 0 || until > 3*time.Second {
		t.Errorf("expires_at is %s away, want about 2s", until)
	}
	if out := d.MustCLI("exec", id, "--", "echo", "alive"); out != "alive\n" {
		t.Errorf("exec before the timeout: %q", out)
	}
	start := time.Now()
	gone := waitFor(15*time.Second, 200*time.Millisecond, func() bool {
		return strings.TrimSpace(d.MustCLI("ls", "-q")) == ""
	})
	if !gone {
		t.Fatalf("sandbox with --timeout 2s still listed after %s: %s", time.Since(start), d.MustCLI("ls"))
	}
	t.Logf("removed %s after its expiry", time.Since(*sb.ExpiresAt).Round(time.Millisecond))
	if r := d.CLI("inspect", id); r.Code == 0 || !strings.Contains(r.Stderr, "not found") {
		t.Errorf("inspect after the timeout: exit %d stderr %q", r.Code, r.Stderr)
	}
	if !waitFor(5*time.Second, 100*time.Millisecond, func() bool { return len(d.traces(sb)) == 0 }) {
		t.Errorf("timed-out sandbox left traces: %v", d.traces(sb))
	}
}

// TestRemoveLeavesNoTrace: rm -f of a busy sandbox (processes, files, a
// capped disk) removes its mounts, cgroups, loop device, directories and
// processes at once, and so does rm of a stopped one.
func TestRemoveLeavesNoTrace(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	tests := []struct {
		name string
		args []string
		stop bool
	}{
		{name: "running, default disk"},
		{name: "running, own disk", args: []string{"--disk", "32m", "--memory", "64m", "--pids", "32"}},
		{name: "stopped", args: []string{"--disk", "32m"}, stop: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := d.createCLI(tt.args...)
			d.Sh(id, "echo data > /workspace/f; mkdir -p /tmp/x; sleep 300 >/dev/null 2>&1 & sleep 300 >/dev/null 2>&1 & echo started")
			sb := d.get(id)
			if n := len(pidsInUIDRange(sb.Runtime.UIDBase)); n < 3 {
				t.Errorf("found %d host processes of the sandbox, want at least 3 (guest and two sleeps)", n)
			}
			if tt.stop {
				d.MustCLI("stop", id)
				if pids := pidsInUIDRange(sb.Runtime.UIDBase); len(pids) > 0 {
					t.Errorf("processes left after stop: %v", pids)
				}
				d.MustCLI("rm", id)
			} else {
				d.MustCLI("rm", "-f", id)
			}
			if left := d.traces(sb); len(left) > 0 {
				t.Errorf("traces right after rm: %v", left)
			}
			if left := d.daemonTraces(); len(left) > 0 {
				t.Errorf("daemon still holds: %v", left)
			}
		})
	}
}

// TestPrivateRoot: a daemon whose directories sit under a directory only
// root may enter (StartDaemon's 0700 temp dir, or a state dir under /root)
// must still run sandboxes; and if a create fails half-way, nothing of it
// may stay behind.
func TestPrivateRoot(t *testing.T) {
	t.Parallel()
	d := StartDaemon(t) // not newDaemon: keep the root 0700
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, createErr := d.Client().Create(ctx, api.CreateRequest{})
	t.Run("create works", func(t *testing.T) {
		if createErr != nil {
			var why []string
			for _, l := range lines(d.Log()) {
				if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
					why = append(why, l)
				}
			}
			t.Fatalf("create under a 0700 root: %v\n%s", createErr, strings.Join(why, "\n"))
		}
		if r := d.run(sb.ID, "", "echo", "hi"); r.ExitCode != 0 || r.Stdout != "hi\n" {
			t.Errorf("exec: %v", r)
		}
	})
	t.Run("failed create leaves no trace", func(t *testing.T) {
		if createErr == nil {
			t.Skip("create did not fail; nothing to check")
		}
		if left := d.daemonTraces(); len(left) > 0 {
			t.Errorf("failed create (%v) left: %v", createErr, left)
		}
		if ids := strings.TrimSpace(d.MustCLI("ls", "-q")); ids != "" {
			t.Errorf("failed create left sandboxes listed: %q", ids)
		}
	})
	t.Run("restart removes what a failed create left", func(t *testing.T) {
		if createErr == nil {
			t.Skip("create did not fail; nothing to check")
		}
		d.Kill9()
		d.Start()
		if left := d.daemonTraces(); len(left) > 0 {
			t.Errorf("after a restart: %v", left)
		}
	})
}

// TestHostnameFile: a sandbox's /etc/hostname is the gateway's file,
// bound read-only and naming it, so a sandbox that runs a command and
// writes nothing leaves its disk's writable layer empty (a guest that
// wrote the file made a copy of /etc and a data block on the disk of
// every sandbox).
func TestHostnameFile(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.createCLI()
	if out := d.Sh(id, `cat /etc/hostname; echo "$HOSTNAME"; hostname`); out != id+"\n"+id+"\n"+id+"\n" {
		t.Fatalf("/etc/hostname, $HOSTNAME and hostname: %q, want the id %s thrice", out, id)
	}
	if r := d.run(id, "", "sh", "-c", "echo other > /etc/hostname"); r.ExitCode == 0 || !strings.Contains(r.Stderr, "Read-only") {
		t.Errorf("writing /etc/hostname: %+v; want a read-only file system", r)
	}
	upper := filepath.Join(d.StateDir, "storage", "disks", "vol", id, "root", "upper")
	if ents, err := os.ReadDir(upper); err != nil || len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("the sandbox's writable layer %s after reading its files: %v, %v; want it empty", upper, names, err)
	}
}
