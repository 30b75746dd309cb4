package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStopOnlyItsDaemon: `make down` (paddock serve --stop) stops the
// daemon of its run dir and no other: it used to pkill every process
// whose command line began with the installed binary's path, which
// matched private daemons started with other state and run dirs. A second
// daemon on a run dir in use is refused.
func TestStopOnlyItsDaemon(t *testing.T) {
	a := StartDaemon(t, "--warm-guests", "0", "--blank-guests", "0")
	b := StartDaemon(t, "--warm-guests", "0", "--blank-guests", "0")
	pidFile := filepath.Join(a.RunDir, "paddock.pid")
	if got, err := os.ReadFile(pidFile); err != nil || strings.TrimSpace(string(got)) != strconv.Itoa(a.cmd.Process.Pid) {
		t.Fatalf("%s holds %q (%v), want the daemon's pid %d", pidFile, got, err, a.cmd.Process.Pid)
	}

	second := exec.Command(paddockBin, "serve", "--run-dir", a.RunDir, "--state-dir", t.TempDir(),
		"--listen", "unix://"+filepath.Join(t.TempDir(), "p.sock"), "--no-network")
	out, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "already runs with run dir "+a.RunDir) {
		t.Fatalf("a second daemon on %s: %v\n%s", a.RunDir, err, out)
	}

	// The Makefile's down, with the installed binary at PREFIX/bin.
	prefix := t.TempDir()
	if err := os.Mkdir(filepath.Join(prefix, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(paddockBin, filepath.Join(prefix, "bin", "paddock")); err != nil {
		t.Fatal(err)
	}
	down := exec.Command("make", "-C", "..", "down", "PREFIX="+prefix)
	down.Env = append(os.Environ(), "PADDOCK_RUN_DIR="+a.RunDir)
	if out, err := down.CombinedOutput(); err != nil {
		t.Fatalf("make down: %v\n%s", err, out)
	}
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool { return !alive(a.cmd.Process.Pid) }) {
		t.Fatalf("make down left daemon %d of %s running", a.cmd.Process.Pid, a.RunDir)
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Errorf("the stopped daemon left its pid file: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.Client().Version(ctx); err != nil || !alive(b.cmd.Process.Pid) {
		t.Fatalf("make down for %s stopped the other daemon too: %v", a.RunDir, err)
	}

	// Nothing runs there now: down says so and succeeds.
	again := exec.Command(paddockBin, "serve", "--stop", "--run-dir", a.RunDir)
	if out, err := again.CombinedOutput(); err != nil || !strings.Contains(string(out), "no paddock daemon runs") {
		t.Errorf("serve --stop with no daemon: %v\n%s", err, out)
	}
}
