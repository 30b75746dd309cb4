package test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// filesCtx is a test-bounded context.
func filesCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// readString reads a whole sandbox file through the SDK.
func readString(t *testing.T, c *client.Client, id, p string) (string, error) {
	t.Helper()
	rc, err := c.ReadFile(filesCtx(t, 30*time.Second), id, p)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

func writeString(t *testing.T, c *client.Client, id, p, data string, opts client.WriteOptions) (*client.FileInfo, error) {
	t.Helper()
	return c.WriteFile(filesCtx(t, 30*time.Second), id, p, strings.NewReader(data), opts)
}

// status returns the HTTP status of an SDK error.
func errStatus(err error) int {
	var e *client.Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// TestFilesOps drives every file operation through the SDK and checks
// the result from inside the sandbox.
func TestFilesOps(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	c := d.Client()
	id := d.Create(api.CreateRequest{})
	ctx := filesCtx(t, 2*time.Minute)
	d.Sh(id, "useradd -M -u 1500 -U alice 2>/dev/null || (echo 'alice:x:1500:1500::/home/alice:/bin/sh' >> /etc/passwd && echo 'alice:x:1500:' >> /etc/group)")

	// Write: atomic, with mode and owner; a relative path is the workdir's.
	fi, err := writeString(t, c, id, "notes/a.txt", "hello\n", client.WriteOptions{Mode: 0o640, Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if fi.Path != "/workspace/notes/a.txt" || fi.Size != 6 || fi.Mode != 0o640 || fi.User != "alice" || fi.Group != "alice" || fi.Type != client.TypeFile {
		t.Errorf("write answered %+v", fi)
	}
	if got := d.Sh(id, "stat -c '%a %U %G %s' /workspace/notes/a.txt"); strings.TrimSpace(got) != "640 alice alice 6" {
		t.Errorf("in the sandbox the file is %q", got)
	}
	if got, err := readString(t, c, id, "/workspace/notes/a.txt"); err != nil || got != "hello\n" {
		t.Errorf("read = %q, %v", got, err)
	}
	// A byte range.
	rc, err := c.ReadFileRange(ctx, id, "/workspace/notes/a.txt", 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "ell" {
		t.Errorf("range read = %q", b)
	}
	// Rewriting keeps mode and owner unless told; setuid and a numeric
	// owner work too.
	if _, err := writeString(t, c, id, "/workspace/notes/a.txt", "again\n", client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := d.Sh(id, "stat -c '%a %U' /workspace/notes/a.txt; cat /workspace/notes/a.txt"); got != "640 alice\nagain\n" {
		t.Errorf("after a rewrite: %q", got)
	}
	if _, err := writeString(t, c, id, "/workspace/suid", "#!/bin/sh\n", client.WriteOptions{Mode: 0o755 | os.ModeSetuid, Owner: "1234:1500"}); err != nil {
		t.Fatal(err)
	}
	if got := d.Sh(id, "stat -c '%a %u %g' /workspace/suid"); strings.TrimSpace(got) != "4755 1234 1500" {
		t.Errorf("suid file is %q", got)
	}

	// An interrupted write leaves the old file and no temporary file.
	wctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := c.WriteFile(wctx, id, "/workspace/notes/a.txt", pr, client.WriteOptions{})
		done <- err
	}()
	pw.Write(bytes.Repeat([]byte("x"), 4<<20))
	cancel()
	pw.Close()
	if err := <-done; err == nil {
		t.Error("a cancelled write succeeded")
	}
	if !waitFor(5*time.Second, 50*time.Millisecond, func() bool {
		return d.Sh(id, "ls -A /workspace/notes") == "a.txt\n"
	}) {
		t.Errorf("after an interrupted write /workspace/notes holds %q", d.Sh(id, "ls -A /workspace/notes"))
	}
	if got := d.Sh(id, "cat /workspace/notes/a.txt"); got != "again\n" {
		t.Errorf("an interrupted write changed the file to %q", got)
	}

	// stat, exists.
	d.Sh(id, "ln -s /etc/hostname /workspace/link && mkfifo /workspace/fifo")
	if fi, err := c.Stat(ctx, id, "/workspace/link"); err != nil || fi.Type != client.TypeSymlink || fi.LinkTarget != "/etc/hostname" {
		t.Errorf("stat link = %+v, %v", fi, err)
	}
	if ok, err := c.Exists(ctx, id, "/workspace/notes"); !ok || err != nil {
		t.Errorf("exists of a directory = %v, %v", ok, err)
	}
	if ok, err := c.Exists(ctx, id, "/workspace/nope"); ok || err != nil {
		t.Errorf("exists of a missing file = %v, %v", ok, err)
	}
	if ok, err := c.Exists(ctx, "no-such-sandbox", "/workspace"); ok || !errors.Is(err, client.ErrNotFound) {
		t.Errorf("exists in a missing sandbox = %v, %v", ok, err)
	}

	// mkdir -p with mode and owner; list with depth.
	if fi, err := c.Mkdir(ctx, id, "/workspace/tree/a/b", client.MkdirOptions{Parents: true, Mode: 0o750, Owner: "alice"}); err != nil || !fi.IsDir() || fi.Mode != 0o750 || fi.User != "alice" {
		t.Errorf("mkdir -p = %+v, %v", fi, err)
	}
	d.Sh(id, "touch /workspace/tree/a/b/leaf /workspace/tree/top && ln -s a /workspace/tree/alink")
	for _, tc := range []struct {
		depth int
		want  string
	}{
		{1, "a alink top"},
		{2, "a a/b alink top"},
		{5, "a a/b a/b/leaf alink top"},
	} {
		entries, err := c.ListFiles(ctx, id, "/workspace/tree", tc.depth)
		var names []string
		for _, e := range entries {
			names = append(names, strings.TrimPrefix(e.Path, "/workspace/tree/"))
		}
		if err != nil || strings.Join(names, " ") != tc.want {
			t.Errorf("list depth %d = %q, %v; want %q", tc.depth, names, err, tc.want)
		}
		for _, e := range entries {
			if e.Name == "alink" && (e.Type != client.TypeSymlink || e.LinkTarget != "a") {
				t.Errorf("alink listed as %+v", e)
			}
			if e.Name == "b" && (e.User != "alice" || e.Mode != 0o750 || e.ModTime.IsZero()) {
				t.Errorf("b listed as %+v", e)
			}
		}
	}

	// move, with and without overwrite; remove.
	if fi, err := c.Move(ctx, id, "/workspace/tree/top", "/workspace/tree/moved", false); err != nil || fi.Path != "/workspace/tree/moved" {
		t.Errorf("move = %+v, %v", fi, err)
	}
	d.Sh(id, "echo other > /workspace/other")
	if _, err := c.Move(ctx, id, "/workspace/other", "/workspace/tree/moved", false); !errors.Is(err, client.ErrConflict) || errStatus(err) != 409 {
		t.Errorf("move onto an existing file: %v", err)
	}
	if _, err := c.Move(ctx, id, "/workspace/other", "/workspace/tree/moved", true); err != nil {
		t.Errorf("move with overwrite: %v", err)
	}
	if err := c.Remove(ctx, id, "/workspace/tree", false); !errors.Is(err, client.ErrConflict) || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("remove of a non-empty directory: %v", err)
	}
	if err := c.Remove(ctx, id, "/workspace/tree", true); err != nil {
		t.Errorf("remove -r: %v", err)
	}
	if got := d.Sh(id, "ls /workspace/tree 2>&1 || true"); !strings.Contains(got, "No such file") {
		t.Errorf("after remove -r: %q", got)
	}

	// Errors: status codes and messages that name the path or parameter.
	for _, tc := range []struct {
		name   string
		err    error
		status int
		says   string
	}{
		{"read missing", func() error { _, err := readString(t, c, id, "/workspace/missing"); return err }(), 404, "/workspace/missing"},
		{"read directory", func() error { _, err := readString(t, c, id, "/workspace"); return err }(), 409, "is a directory"},
		{"read fifo", func() error { _, err := readString(t, c, id, "/workspace/fifo"); return err }(), 400, "not a regular file"},
		{"write over directory", func() error {
			_, err := writeString(t, c, id, "/workspace/notes", "x", client.WriteOptions{})
			return err
		}(), 409, "is a directory"},
		{"write unknown owner", func() error {
			_, err := writeString(t, c, id, "/workspace/x", "x", client.WriteOptions{Owner: "mallory"})
			return err
		}(), 400, "mallory"},
		{"mkdir existing", func() error { _, err := c.Mkdir(ctx, id, "/workspace/notes", client.MkdirOptions{}); return err }(), 409, "exists"},
		{"mkdir missing parent", func() error { _, err := c.Mkdir(ctx, id, "/workspace/p/q", client.MkdirOptions{}); return err }(), 404, "/workspace/p"},
		{"remove missing", c.Remove(ctx, id, "/workspace/missing", false), 404, "/workspace/missing"},
		{"remove /", c.Remove(ctx, id, "/", true), 400, "/"},
		{"list a file", func() error { _, err := c.ListFiles(ctx, id, "/workspace/suid", 1); return err }(), 409, "not a directory"},
		{"stat missing", func() error { _, err := c.Stat(ctx, id, "/workspace/missing"); return err }(), 404, "/workspace/missing"},
		{"unknown sandbox", func() error { _, err := c.Stat(ctx, "nope", "/"); return err }(), 404, "nope"},
	} {
		if errStatus(tc.err) != tc.status || !strings.Contains(tc.err.Error(), tc.says) {
			t.Errorf("%s: %v (status %d), want %d naming %q", tc.name, tc.err, errStatus(tc.err), tc.status, tc.says)
		}
	}
	// A bad parameter is named.
	a := d.do("GET", "/v1/sandboxes/"+id+"/files?path=/workspace&offset=x", "")
	if e := a.apiError(t); a.Status != 400 || !strings.Contains(e.Message, "offset") {
		t.Errorf("bad offset: %d %+v", a.Status, e)
	}
	// Content-Length is set on reads of regular files.
	a = d.do("GET", "/v1/sandboxes/"+id+"/files?path=/workspace/notes/a.txt", "")
	if a.Status != 200 || a.Header.Get("Content-Length") != "6" || string(a.Body) != "again\n" {
		t.Errorf("raw read: %d %v %q", a.Status, a.Header, a.Body)
	}

	// Tar round trip inside the sandbox: download a tree, upload it elsewhere.
	d.Sh(id, "mkdir -p /workspace/proj/src && echo main > /workspace/proj/src/main.go && chmod 700 /workspace/proj/src && ln -s src/main.go /workspace/proj/main && chown -R alice /workspace/proj")
	tr, err := c.DownloadTar(ctx, id, "/workspace/proj")
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.UploadTar(ctx, id, "/workspace/copy", tr, client.UploadOptions{})
	tr.Close()
	if err != nil || res.Entries != 4 {
		t.Fatalf("upload = %+v, %v", res, err)
	}
	if got := d.Sh(id, "cd /workspace/copy/proj && stat -c '%n %a %U' src src/main.go && readlink main && cat main"); got != "src 700 alice\nsrc/main.go 644 alice\nsrc/main.go\nmain\n" {
		t.Errorf("copied tree: %q", got)
	}
	// A full disk is a 413 that names the file, and leaves nothing behind.
	small := d.Create(api.CreateRequest{Resources: api.Resources{DiskBytes: 64 << 20}})
	_, err = c.WriteFile(ctx, small, "/workspace/big", io.LimitReader(zeros{}, 300<<20), client.WriteOptions{})
	if !errors.Is(err, client.ErrTooLarge) || errStatus(err) != 413 || !strings.Contains(err.Error(), "/workspace/big") {
		t.Errorf("writing past a full disk: %v", err)
	}
	if got := d.Sh(small, "ls -A /workspace"); got != "" {
		t.Errorf("a failed write left %q", got)
	}

	// A stopped sandbox answers 409.
	if _, err := c.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, id, "/"); errStatus(err) != 409 {
		t.Errorf("stat in a stopped sandbox: %v", err)
	}
}

// TestFilesWatch checks the events of create, write, remove, rename and
// chmod, recursive watches, and how a watch ends.
func TestFilesWatch(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	c := d.Client()
	id := d.Create(api.CreateRequest{})
	ctx := filesCtx(t, time.Minute)
	d.Sh(id, "mkdir -p /workspace/w/old")
	w, err := c.Watch(ctx, id, "/workspace/w", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	expect := func(script string, want ...string) {
		t.Helper()
		d.Sh(id, script)
		var seen []string
		timeout := time.After(10 * time.Second)
		for len(want) > 0 {
			select {
			case ev, ok := <-w.Events:
				if !ok {
					t.Fatalf("watch ended (%v); saw %q, want %q", w.Err(), seen, want)
				}
				s := ev.Type + " " + ev.Path
				if ev.OldPath != "" {
					s += " <- " + ev.OldPath
				}
				seen = append(seen, s)
				if s == want[0] {
					want = want[1:]
				}
			case <-timeout:
				t.Fatalf("after %q saw %q, still want %q", script, seen, want)
			}
		}
	}
	expect("echo a > /workspace/w/f", "create /workspace/w/f", "write /workspace/w/f")
	expect("echo b >> /workspace/w/f", "write /workspace/w/f")
	expect("chmod 600 /workspace/w/f", "chmod /workspace/w/f")
	expect("mv /workspace/w/f /workspace/w/g", "rename /workspace/w/g <- /workspace/w/f")
	expect("rm /workspace/w/g", "remove /workspace/w/g")
	expect("touch /workspace/w/old/x", "create /workspace/w/old/x")
	expect("mkdir -p /workspace/w/new/deep && echo z > /workspace/w/new/deep/z", "create /workspace/w/new", "create /workspace/w/new/deep/z")
	expect("echo y > /workspace/w/new/deep/y", "create /workspace/w/new/deep/y")
	// Writes through the file API are seen too.
	if _, err := writeString(t, c, id, "/workspace/w/api.txt", "x", client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("true", "write /workspace/w/api.txt")

	// A flat watch does not see subdirectories.
	flat, err := c.Watch(ctx, id, "/workspace/w", false)
	if err != nil {
		t.Fatal(err)
	}
	d.Sh(id, "touch /workspace/w/old/hidden /workspace/w/seen")
	select {
	case ev := <-flat.Events:
		if ev.Path != "/workspace/w/seen" {
			t.Errorf("flat watch saw %+v first", ev)
		}
	case <-time.After(10 * time.Second):
		t.Error("flat watch saw nothing")
	}
	flat.Close()

	// Watching a missing directory or a file is refused.
	if _, err := c.Watch(ctx, id, "/workspace/nope", false); errStatus(err) != 404 {
		t.Errorf("watch of a missing directory: %v", err)
	}
	// Removing the watched directory ends the watch; so does the sandbox.
	gone, err := c.Watch(ctx, id, "/workspace/w/old", false)
	if err != nil {
		t.Fatal(err)
	}
	d.Sh(id, "rm -rf /workspace/w/old")
	waitClosed(t, gone, client.ErrNotFound)
	if _, err := c.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, w, client.ErrConflict)
}

func waitClosed(t *testing.T, w *client.Watcher, want error) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-w.Events:
			if !ok {
				if !errors.Is(w.Err(), want) {
					t.Errorf("watch ended with %v, want %v", w.Err(), want)
				}
				return
			}
		case <-deadline:
			t.Fatal("the watch did not end")
		}
	}
}

// TestFilesCLI drives cp and the files verbs through the binary.
func TestFilesCLI(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{})
	local := t.TempDir()
	mk := func(p, data string, mode os.FileMode) {
		os.MkdirAll(filepath.Dir(filepath.Join(local, p)), 0o755)
		if err := os.WriteFile(filepath.Join(local, p), []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("proj/main.go", "package main\n", 0o644)
	mk("proj/run.sh", "#!/bin/sh\necho run\n", 0o755)
	mk("proj/sub/deep.txt", "deep\n", 0o600)
	os.Symlink("sub/deep.txt", filepath.Join(local, "proj/link"))
	mk("single.txt", "single\n", 0o640)

	// Host to sandbox: a file into a directory, a file to a new name, a
	// directory into a directory (it keeps its name), a directory to a
	// new name, and contents with /.
	d.MustCLI("cp", filepath.Join(local, "single.txt"), id+":/workspace")
	d.MustCLI("cp", filepath.Join(local, "single.txt"), id+":/workspace/renamed.txt")
	d.MustCLI("cp", filepath.Join(local, "proj"), id+":/workspace")
	d.MustCLI("cp", filepath.Join(local, "proj"), id+":/workspace/proj2")
	d.MustCLI("files", "mkdir", id, "/workspace/flat")
	d.MustCLI("cp", filepath.Join(local, "proj")+"/.", id+":/workspace/flat")
	got := d.Sh(id, `cd /workspace && for f in single.txt renamed.txt proj/main.go proj/run.sh proj/sub/deep.txt proj2/sub/deep.txt flat/main.go; do stat -c '%n %a %U' $f; done; readlink proj/link; ./proj/run.sh`)
	want := "single.txt 640 root\nrenamed.txt 640 root\nproj/main.go 644 root\nproj/run.sh 755 root\nproj/sub/deep.txt 600 root\nproj2/sub/deep.txt 600 root\nflat/main.go 644 root\nsub/deep.txt\nrun\n"
	if got != want {
		t.Errorf("in the sandbox:\n%s\nwant:\n%s", got, want)
	}
	if r := d.CLI("cp", filepath.Join(local, "single.txt"), id+":/workspace/nodir/"); r.Code == 0 || !strings.Contains(r.Stderr, "no such directory") {
		t.Errorf("cp to a missing directory ending in /: %+v", r)
	}

	// Sandbox to host, the same cases.
	out := t.TempDir()
	d.MustCLI("cp", id+":/workspace/proj", out)
	d.MustCLI("cp", id+":/workspace/proj", filepath.Join(out, "copy"))
	d.MustCLI("cp", id+":/workspace/single.txt", filepath.Join(out, "one.txt"))
	d.MustCLI("cp", id+":/workspace/single.txt", out)
	for _, p := range []string{"proj/main.go", "proj/sub/deep.txt", "copy/run.sh", "one.txt", "single.txt"} {
		if _, err := os.Stat(filepath.Join(out, p)); err != nil {
			t.Errorf("cp out: %v", err)
		}
	}
	if l, err := os.Readlink(filepath.Join(out, "proj/link")); err != nil || l != "sub/deep.txt" {
		t.Errorf("cp out: link is %q, %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(out, "copy/run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("cp out: run.sh %v %v", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "proj/sub/deep.txt")); string(b) != "deep\n" {
		t.Errorf("cp out: deep.txt holds %q", b)
	}

	// Tar streams on stdin and stdout.
	tarOut := exec.Command(paddockBin, "--host", d.Host, "cp", id+":/workspace/proj", "-")
	tarball, err := tarOut.Output()
	if err != nil {
		t.Fatal(err)
	}
	names := tarNames(t, tarball)
	if !strings.Contains(names, "proj/sub/deep.txt") {
		t.Errorf("cp to - gave entries %s", names)
	}
	cpIn := exec.Command(paddockBin, "--host", d.Host, "cp", "-", id+":/workspace/fromtar")
	cpIn.Stdin = bytes.NewReader(tarball)
	if out, err := cpIn.CombinedOutput(); err != nil {
		t.Fatalf("cp -: %v %s", err, out)
	}
	if got := d.Sh(id, "cat /workspace/fromtar/proj/sub/deep.txt"); got != "deep\n" {
		t.Errorf("cp - extracted %q", got)
	}

	// files verbs.
	if got := d.MustCLI("files", "cat", id, "/workspace/proj/main.go"); got != "package main\n" {
		t.Errorf("files cat = %q", got)
	}
	if got := d.MustCLI("files", "ls", id, "/workspace/proj"); got != "link\nmain.go\nrun.sh\nsub\n" {
		t.Errorf("files ls = %q", got)
	}
	if got := d.MustCLI("files", "ls", "--depth", "2", id, "/workspace/proj"); !strings.Contains(got, "sub/deep.txt\n") {
		t.Errorf("files ls --depth 2 = %q", got)
	}
	long := d.MustCLI("files", "ls", "-l", id, "/workspace/proj")
	for _, w := range []string{`-rwxr-xr-x +root +root +19 .* run.sh\n`, `lrwxrwxrwx .* link -> sub/deep.txt\n`, `drwxr-xr-x .* sub\n`} {
		if !regexp.MustCompile(w).MatchString(long) {
			t.Errorf("files ls -l does not match %q:\n%s", w, long)
		}
	}
	d.MustCLI("files", "mkdir", "-p", "-m", "0700", id, "/workspace/a/b/c")
	d.MustCLI("files", "mv", id, "/workspace/a/b/c", "/workspace/a/c2")
	d.MustCLI("files", "rm", id, "/workspace/a/c2")
	if r := d.CLI("files", "rm", id, "/workspace/a"); r.Code == 0 || len(lines(r.Stderr)) != 1 || !strings.Contains(r.Stderr, "not empty") {
		t.Errorf("files rm of a non-empty directory: %+v", r)
	}
	d.MustCLI("files", "rm", "-r", id, "/workspace/a")
	if r := d.CLI("files", "cat", id, "/workspace/a"); r.Code == 0 || len(lines(r.Stderr)) != 1 || !strings.Contains(r.Stderr, "/workspace/a: no such file") {
		t.Errorf("files cat of a removed directory: %+v", r)
	}
	if r := d.CLIInput("piped\n", "files", "write", "-m", "600", id, "/workspace/piped"); r.Code != 0 {
		t.Errorf("files write: %+v", r)
	}
	if got := d.Sh(id, "stat -c %a /workspace/piped; cat /workspace/piped"); got != "600\npiped\n" {
		t.Errorf("files write made %q", got)
	}

	// files watch prints events until interrupted.
	watch := exec.Command(paddockBin, "--host", d.Host, "files", "watch", "-r", id, "/workspace")
	var wout syncBuffer
	watch.Stdout = &wout
	watch.Stderr = &wout
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	ok := waitFor(10*time.Second, 100*time.Millisecond, func() bool {
		d.Sh(id, "touch /workspace/watched-$(date +%s%N)")
		return strings.Contains(wout.String(), "create /workspace/watched-")
	})
	watch.Process.Signal(syscall.SIGINT)
	err = watch.Wait()
	if !ok || err != nil {
		t.Errorf("files watch: saw %v, exit %v, output %q", ok, err, wout.String())
	}
}

func tarNames(t *testing.T, b []byte) string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return strings.Join(names, " ")
		}
		if err != nil {
			t.Fatalf("reading tar: %v", err)
		}
		names = append(names, h.Name)
	}
}

// treeDigest hashes the names, types, modes and contents under root,
// skipping the subtrees in skip.
func treeDigest(t *testing.T, root string, skip ...string) string {
	t.Helper()
	h := sha256.New()
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		for _, s := range skip {
			if p == s && e.IsDir() {
				return filepath.SkipDir
			}
			if p == s {
				return nil
			}
		}
		fi, err := e.Info()
		if err != nil {
			return nil
		}
		fmt.Fprintf(h, "%s %v\n", p, fi.Mode())
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err == nil {
				io.Copy(h, f)
				f.Close()
			}
		}
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))
}

// settledDigest is treeDigest once two readings 200 ms apart agree.
func settledDigest(t *testing.T, root string, skip ...string) string {
	t.Helper()
	last := treeDigest(t, root, skip...)
	for range 25 {
		time.Sleep(200 * time.Millisecond)
		now := treeDigest(t, root, skip...)
		if now == last {
			return now
		}
		last = now
	}
	t.Fatalf("%s keeps changing", root)
	return ""
}

// TestFilesHostile plants the links a hostile sandbox would and runs
// every file op through them, through the real daemon. Each must land
// inside the sandbox or be refused with an error naming the path; the
// host's /etc/shadow, a marker in the host's /root and the daemon's state
// dir must not change, and the daemon must keep serving. On both tiers:
// under gVisor the guest resolves paths through gVisor's kernel.
func TestFilesHostile(t *testing.T) {
	t.Parallel()
	d := tierDaemon(t)
	forTiers(t, func(t *testing.T, tier string) { filesHostile(t, d, tier) })
}

func filesHostile(t *testing.T, d *Daemon, tier string) {
	c := d.Client()
	id := d.Create(api.CreateRequest{Runtime: tier})
	ctx := filesCtx(t, 2*time.Minute)

	tag := randHex(6)
	marker := "/root/paddock-files-marker-" + tag
	if err := os.WriteFile(marker, []byte("host marker "+tag), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(marker) })
	shadowSum := fileSHA256(t, "/etc/shadow")
	// The state dir (the store included), less the storage (disks and
	// the image they live in): the sandbox's writable layer is what file
	// ops change, and the pool refills.
	// The gateway's per-sandbox files (the /run/paddock tree) are kept
	// current by the daemon.
	stateSkip := []string{filepath.Join(d.StateDir, "storage"), filepath.Join(d.StateDir, "storage.xfs"), filepath.Join(d.StateDir, "gateway"), filepath.Join(d.StateDir, "telemetry")}
	// The create's record reaches the database from the store's journal
	// a moment after the create (docs/ARCHITECTURE.md, "State and
	// restarts"): the digest is taken once the state dir has settled.
	stateSum := settledDigest(t, d.StateDir, stateSkip...)
	hostEvil := []string{"/evil-" + tag, "/tmp/evil-" + tag, "/etc/evil-" + tag, "/root/evil-" + tag, filepath.Join(d.StateDir, "evil-"+tag)}

	d.Sh(id, fmt.Sprintf(`set -e
cd /workspace
ln -s /etc/shadow shadow
ln -s ../../.. up
ln -s ../../../../../../../.. deepup
ln -s /etc etc
ln -s /proc/1/root proc1root
ln -s /proc/self/root selfroot
ln -s /proc/1/cwd proc1cwd
ln -s /proc/1/exe proc1exe
ln -s %[1]s marker
ln -s /root root
ln -s %[2]s statedir
for n in 0 1 2 3 4 5 6 7 8 9; do ln -s /proc/1/fd/$n fd$n; done
echo sandbox-shadow > /etc/shadow
echo sandbox-file > /workspace/file`, marker, d.StateDir))

	read := func(p string) func() (string, error) {
		return func() (string, error) { return readString(t, c, id, p) }
	}
	write := func(p string) func() (string, error) {
		return func() (string, error) {
			_, err := writeString(t, c, id, p, "written-"+tag, client.WriteOptions{})
			return "", err
		}
	}
	inSandbox := func(p, want string) func(t *testing.T) {
		return func(t *testing.T) {
			if got := d.Sh(id, "cat "+p+" 2>&1 || true"); strings.TrimSpace(got) != want {
				t.Errorf("in the sandbox %s holds %q, want %q", p, got, want)
			}
		}
	}
	upload := func(dir string, entries ...tarEntrySpec) func() (string, error) {
		return func() (string, error) {
			_, err := c.UploadTar(ctx, id, dir, bytes.NewReader(makeTarball(t, entries...)), client.UploadOptions{})
			return "", err
		}
	}
	reg := func(name string) tarEntrySpec { return tarEntrySpec{name: name, typ: tar.TypeReg, body: "evil-" + tag} }
	sym := func(name, target string) tarEntrySpec {
		return tarEntrySpec{name: name, typ: tar.TypeSymlink, link: target}
	}
	hard := func(name, target string) tarEntrySpec {
		return tarEntrySpec{name: name, typ: tar.TypeLink, link: target}
	}

	type hostileCase struct {
		name   string
		do     func() (string, error)
		status int    // the refusal's HTTP status; 0: must succeed
		says   string // what the refusal must name
		// mayBeGone: the target may not exist at that moment (a guest's
		// fd above 2 comes and goes), so 404 or 409 naming says is as
		// good as the refusal.
		mayBeGone bool
		want      string // what a successful read returns
		check     func(t *testing.T)
	}
	cases := []hostileCase{
		{name: "read link to /etc/shadow", do: read("/workspace/shadow"), want: "sandbox-shadow\n"},
		{name: "read via ../../..", do: read("/workspace/up/etc/shadow"), want: "sandbox-shadow\n"},
		{name: "read via many ..", do: read("/workspace/deepup/etc/shadow"), want: "sandbox-shadow\n"},
		{name: "read a .. path", do: read("/../../../../etc/shadow"), want: "sandbox-shadow\n"},
		{name: "read a relative .. path", do: read("../../../../etc/shadow"), want: "sandbox-shadow\n"},
		{name: "read link to host marker", do: read("/workspace/marker"), status: 404, says: "/workspace/marker"},
		{name: "read via link to /root", do: read("/workspace/root/" + filepath.Base(marker)), status: 404, says: filepath.Base(marker)},
		{name: "read via link to the state dir", do: read("/workspace/statedir/paddock.db"), status: 404, says: "/workspace/statedir/paddock.db"},
		{name: "read via /proc/1/root", do: read("/workspace/proc1root/etc/shadow"), status: 403, says: "/workspace/proc1root/etc/shadow"},
		{name: "read via /proc/self/root", do: read("/workspace/selfroot/etc/shadow"), status: 403, says: "selfroot"},
		{name: "read via /proc/1/cwd", do: read("/workspace/proc1cwd/etc/shadow"), status: 403, says: "proc1cwd"},
		{name: "read /proc/1/exe link", do: read("/workspace/proc1exe"), status: 403, says: "proc1exe"},
		{name: "read /proc/1/root directly", do: read("/proc/1/root/etc/shadow"), status: 403, says: "/proc/1/root"},
		{name: "read /proc/self/environ", do: read("/proc/self/environ"), status: 403, says: "/proc/self/environ"},
		{name: "read /proc/1/mem", do: read("/proc/1/mem"), status: 403, says: "/proc/1/mem"},
		{name: "write over link to /etc/shadow", do: write("/workspace/shadow"), check: func(t *testing.T) {
			inSandbox("/etc/shadow", "sandbox-shadow")(t)
			inSandbox("/workspace/shadow", "written-"+tag)(t)
			if got := d.Sh(id, "stat -c %F /workspace/shadow"); got != "regular file\n" {
				t.Errorf("the link was not replaced: %q", got)
			}
		}},
		{name: "write via link to /etc", do: write("/workspace/etc/evil-" + tag), check: inSandbox("/etc/evil-"+tag, "written-"+tag)},
		{name: "write via ../../..", do: write("/workspace/up/evil-" + tag), check: inSandbox("/evil-"+tag, "written-"+tag)},
		{name: "write via link to /root", do: write("/workspace/root/evil-" + tag), check: inSandbox("/root/evil-"+tag, "written-"+tag)},
		{name: "write via /proc/1/root", do: write("/workspace/proc1root/tmp/evil-" + tag), status: 403, says: "proc1root"},
		{name: "write via /proc/1/cwd", do: write("/workspace/proc1cwd/evil-" + tag), status: 403, says: "proc1cwd"},
		{name: "write into /proc/1", do: write("/proc/1/evil-" + tag), status: 403, says: "/proc/1"},
		{name: "mkdir -p via ../../..", do: func() (string, error) {
			_, err := c.Mkdir(ctx, id, "/workspace/up/tmp/evil-"+tag, client.MkdirOptions{Parents: true})
			return "", err
		}, check: func(t *testing.T) { d.Sh(id, "test -d /tmp/evil-"+tag) }},
		{name: "mkdir via /proc/1/root", do: func() (string, error) {
			_, err := c.Mkdir(ctx, id, "/workspace/proc1root/tmp/evil-"+tag, client.MkdirOptions{Parents: true})
			return "", err
		}, status: 403, says: "proc1root"},
		{name: "stat a magic link itself", do: func() (string, error) {
			fi, err := c.Stat(ctx, id, "/workspace/proc1root")
			if err != nil {
				return "", err
			}
			return fi.Type + " " + fi.LinkTarget, nil
		}, want: "symlink /proc/1/root"},
		{name: "stat via a magic link", do: func() (string, error) { _, err := c.Stat(ctx, id, "/workspace/proc1root/etc"); return "", err }, status: 403, says: "proc1root"},
		{name: "list via ../../..", do: func() (string, error) {
			entries, err := c.ListFiles(ctx, id, "/workspace/up", 1)
			for _, e := range entries {
				if e.Name == "workspace" {
					return "sandbox root", err
				}
			}
			return "", err
		}, want: "sandbox root"},
		{name: "list /proc/1/fd", do: func() (string, error) { _, err := c.ListFiles(ctx, id, "/proc/1/fd", 1); return "", err }, status: 403, says: "/proc/1/fd"},
		{name: "list via /proc/1/root", do: func() (string, error) { _, err := c.ListFiles(ctx, id, "/workspace/proc1root", 1); return "", err }, status: 403, says: "proc1root"},
		{name: "remove -r of a link to ../../..", do: func() (string, error) { return "", c.Remove(ctx, id, "/workspace/up", true) }, check: func(t *testing.T) {
			inSandbox("/etc/shadow", "sandbox-shadow")(t)
			d.Sh(id, "test ! -e /workspace/up && ln -s ../../.. /workspace/up")
		}},
		{name: "remove via /proc/1/root", do: func() (string, error) { return "", c.Remove(ctx, id, "/workspace/proc1root/etc/shadow", false) }, status: 403, says: "proc1root"},
		{name: "move into /proc/1/cwd", do: func() (string, error) {
			_, err := c.Move(ctx, id, "/workspace/file", "/workspace/proc1cwd/evil-"+tag, false)
			return "", err
		}, status: 403, says: "proc1cwd"},
		{name: "move out of /proc", do: func() (string, error) {
			_, err := c.Move(ctx, id, "/proc/1/environ", "/workspace/env", false)
			return "", err
		}, status: 403, says: "/proc/1/environ"},
		{name: "tar of a tree of hostile links", do: func() (string, error) {
			rc, err := c.DownloadTar(ctx, id, "/workspace")
			if err != nil {
				return "", err
			}
			defer rc.Close()
			b, err := io.ReadAll(rc)
			if bytes.Contains(b, []byte("host marker")) {
				return "", errors.New("the tar carries the host marker")
			}
			return "", err
		}},
		{name: "tar via /proc/1/root", do: func() (string, error) { _, err := c.DownloadTar(ctx, id, "/workspace/proc1root/etc"); return "", err }, status: 403, says: "proc1root"},
		{name: "watch /proc/1", do: func() (string, error) { _, err := c.Watch(ctx, id, "/proc/1", false); return "", err }, status: 403, says: "/proc/1"},
		{name: "upload .. entry", do: upload("/workspace/up1", reg("../../../../evil-"+tag)), status: 400, says: "../../../../evil-" + tag},
		{name: "upload absolute entry lands inside", do: upload("/workspace/up2", reg("/etc/evil-"+tag)), check: inSandbox("/workspace/up2/etc/evil-"+tag, "evil-"+tag)},
		{name: "upload symlink then file through it", do: upload("/workspace/up3", sym("l", "/etc"), reg("l/evil-"+tag)), status: 400, says: "l/evil-" + tag},
		{name: "upload symlink .. then file", do: upload("/workspace/up4", sym("l", "../../../../.."), reg("l/tmp/evil-"+tag)), status: 400, says: "l/tmp/evil-" + tag},
		{name: "upload magic link then file", do: upload("/workspace/up5", sym("l", "/proc/1/root"), reg("l/tmp/evil-"+tag)), status: 400, says: "l/tmp/evil-" + tag},
		{name: "upload hard link to /etc/shadow", do: upload("/workspace/up6", hard("h", "/etc/shadow")), status: 400, says: `"h"`},
		{name: "upload hard link with ..", do: upload("/workspace/up7", hard("h", "../../etc/shadow")), status: 400, says: `"h"`},
		{name: "upload hard link through a symlink out", do: upload("/workspace/up8", sym("s", "/etc"), hard("h", "s/shadow")), status: 400, says: `"h"`},
		{name: "upload into a planted dangling link to the host", do: upload("/workspace/statedir", reg("evil-"+tag)), status: 409, says: "/workspace/statedir"},
		{name: "upload into a planted link to /etc", do: upload("/workspace/etc", reg("evil3-"+tag)), check: inSandbox("/etc/evil3-"+tag, "evil-"+tag)},
		{name: "upload through a planted link", do: upload("/workspace", reg("etc/evil2-"+tag)), status: 400, says: "etc/evil2-" + tag},
		{name: "upload a device node", do: upload("/workspace/up9", tarEntrySpec{name: "sda", typ: tar.TypeBlock}), check: func(t *testing.T) {
			d.Sh(id, "test ! -e /workspace/up9/sda")
		}},
	}
	// Every fd of the guest, through its magic link. 0 to 2 are always
	// open; the others may close between the cases.
	for n := 0; n < 10; n++ {
		p := fmt.Sprintf("/workspace/fd%d", n)
		cases = append(cases,
			hostileCase{name: "read " + p, do: read(p), status: 403, says: p, mayBeGone: n > 2},
			hostileCase{name: "write via " + p, do: write(p + "/x"), status: 403, says: p, mayBeGone: n > 2},
		)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.do()
			switch {
			case tc.status != 0:
				st := errStatus(err)
				if tc.mayBeGone && (st == 404 || st == 409) {
					st = tc.status
				}
				if st != tc.status || !strings.Contains(err.Error(), tc.says) {
					t.Errorf("got %q, %v (status %d); want a %d naming %q", out, err, errStatus(err), tc.status, tc.says)
				}
			case err != nil:
				t.Errorf("failed: %v", err)
			case tc.check == nil && out != tc.want:
				t.Errorf("got %q, want %q", out, tc.want)
			}
			if tc.check != nil {
				tc.check(t)
			}
		})
	}

	// A hostile tree copied out to the host stays under the target.
	d.Sh(id, `mkdir -p /workspace/out && cd /workspace/out && ln -s /etc/shadow shadow && ln -s ../../../../../../tmp up && echo ok > ok`)
	hostDir := t.TempDir()
	d.MustCLI("cp", id+":/workspace/out", hostDir)
	if l, _ := os.Readlink(filepath.Join(hostDir, "out/shadow")); l != "/etc/shadow" {
		t.Errorf("the link came out as %q", l)
	}
	// A tar with a symlink and a file written through it, piped in.
	r := d.CLIInput(string(makeTarball(t, sym("x", "/tmp"), reg("x/evil-"+tag))), "cp", "-", id+":/workspace/piped")
	if r.Code == 0 || !strings.Contains(r.Stderr, "x/evil-"+tag) || len(lines(r.Stderr)) != 1 {
		t.Errorf("cp - of a hostile tar: %+v", r)
	}

	// Nothing of the host changed, and the daemon still serves.
	if fileSHA256(t, "/etc/shadow") != shadowSum {
		t.Error("the host's /etc/shadow changed")
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "host marker "+tag {
		t.Errorf("the host marker changed: %q %v", b, err)
	}
	if got := treeDigest(t, d.StateDir, stateSkip...); got != stateSum {
		t.Error("the daemon's state dir changed")
	}
	for _, p := range hostEvil {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s appeared on the host", p)
			os.Remove(p)
		}
	}
	if _, err := c.Version(ctx); err != nil {
		t.Errorf("the daemon stopped serving: %v", err)
	}
	if got, err := readString(t, c, id, "/workspace/file"); err != nil || got != "sandbox-file\n" {
		t.Errorf("after the hostile ops a plain read gives %q, %v", got, err)
	}
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

type tarEntrySpec struct {
	name, link string
	typ        byte
	body       string
}

func makeTarball(t *testing.T, entries ...tarEntrySpec) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, ModTime: time.Now()}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}

// vmRSS returns a process's resident set size in bytes.
func vmRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			var kb int64
			fmt.Sscan(f[1], &kb)
			return kb << 10
		}
	}
	return 0
}

// rssPeak samples processes' RSS until stopped and returns the peaks.
type rssPeak struct {
	pids  []int
	peaks []int64
	stop  chan struct{}
	done  chan struct{}
}

func watchRSS(pids ...int) *rssPeak {
	r := &rssPeak{pids: pids, peaks: make([]int64, len(pids)), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			for i, pid := range r.pids {
				r.peaks[i] = max(r.peaks[i], vmRSS(pid))
			}
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return r
}

func (r *rssPeak) Stop() []int64 {
	close(r.stop)
	<-r.done
	return r.peaks
}

// genReader yields n pseudo-random bytes, hashing them as they go.
type genReader struct {
	left  int64
	state uint64
	hash  io.Writer
}

func (g *genReader) Read(p []byte) (int, error) {
	if g.left <= 0 {
		return 0, io.EOF
	}
	n := len(p) &^ 7
	if n == 0 {
		n = len(p)
	}
	if int64(n) > g.left {
		n = int(g.left)
	}
	for i := 0; i+8 <= n; i += 8 {
		// xorshift64*
		g.state ^= g.state >> 12
		g.state ^= g.state << 25
		g.state ^= g.state >> 27
		v := g.state * 2685821657736338717
		p[i], p[i+1], p[i+2], p[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		p[i+4], p[i+5], p[i+6], p[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	for i := n &^ 7; i < n; i++ {
		p[i] = byte(i)
	}
	g.hash.Write(p[:n])
	g.left -= int64(n)
	return n, nil
}

// TestFilesBigRoundTrip writes 1 GiB through the SDK from a generated
// reader and reads it back, comparing checksums, while the daemon's (and
// the guest's) RSS stays bounded: nothing holds the file in memory.
func TestFilesBigRoundTrip(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB transfer")
	}
	const size = 1 << 30
	const rssLimit = 150 << 20
	d := newDaemon(t)
	c := d.Client()
	id := d.Create(api.CreateRequest{Resources: api.Resources{DiskBytes: 3 << 30}})
	ctx := filesCtx(t, 3*time.Minute)
	daemonPID := d.cmd.Process.Pid
	guestPID := d.hostPID(id)
	before := vmRSS(daemonPID)

	up := sha256.New()
	rss := watchRSS(daemonPID, guestPID, os.Getpid())
	start := time.Now()
	fi, err := c.WriteFile(ctx, id, "/workspace/big.bin", &genReader{left: size, state: 0x9e3779b97f4a7c15, hash: up}, client.WriteOptions{})
	upTime := time.Since(start)
	if err != nil {
		rss.Stop()
		t.Fatal(err)
	}
	if fi.Size != size {
		t.Errorf("wrote %d bytes, want %d", fi.Size, size)
	}
	start = time.Now()
	rc, err := c.ReadFile(ctx, id, "/workspace/big.bin")
	if err != nil {
		rss.Stop()
		t.Fatal(err)
	}
	down := sha256.New()
	n, err := io.CopyBuffer(down, rc, make([]byte, 1<<20))
	rc.Close()
	downTime := time.Since(start)
	peaks := rss.Stop()
	if err != nil || n != size {
		t.Fatalf("read %d bytes, %v", n, err)
	}
	upSum, downSum := hex.EncodeToString(up.Sum(nil)), hex.EncodeToString(down.Sum(nil))
	if upSum != downSum {
		t.Errorf("sha256 of what was written %s, of what was read %s", upSum, downSum)
	}
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	t.Logf("1 GiB up %.2fs (%.0f MiB/s), down %.2fs (%.0f MiB/s); RSS peaks: daemon %.1f MiB (%.1f before), guest %.1f MiB, test process (SDK) %.1f MiB",
		upTime.Seconds(), size/upTime.Seconds()/(1<<20), downTime.Seconds(), size/downTime.Seconds()/(1<<20),
		mib(peaks[0]), mib(before), mib(peaks[1]), mib(peaks[2]))
	for i, who := range []string{"daemon", "guest"} {
		if peaks[i] > rssLimit {
			t.Errorf("%s RSS peaked at %.1f MiB, above %d MiB", who, mib(peaks[i]), rssLimit>>20)
		}
	}
	// The sandbox sees the same bytes.
	if got := d.Sh(id, "sha256sum /workspace/big.bin | cut -d' ' -f1"); strings.TrimSpace(got) != upSum {
		t.Errorf("in the sandbox the file's sha256 is %q, want %s", got, upSum)
	}
	if err := c.Remove(ctx, id, "/workspace/big.bin", false); err != nil {
		t.Error(err)
	}
}

// TestFilesCPSparse: paddock cp keeps the holes of sparse files both ways
// (a 1 GiB file with a few bytes of data takes a few KiB on the host and
// in the sandbox), and a copy out refuses what passes --max-size (a
// 15 TiB sparse file, by default) before writing anything.
func TestFilesCPSparse(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{})
	const size = 1 << 30
	blocks := func(p string) (int64, int64) {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Size, st.Blocks * 512
	}
	_, stderr, st := d.Exec(id, "sh", "-c", `set -e
mkdir -p /workspace/tree
cd /workspace
truncate -s 1G sparse; printf head | dd of=sparse conv=notrunc status=none
printf mid | dd of=sparse bs=1 seek=536870912 conv=notrunc status=none
cp --sparse=always sparse tree/sparse
truncate -s 15T huge; printf x >> huge`)
	if st.ExitCode != 0 {
		t.Fatalf("making sparse files: %s", stderr)
	}

	out := t.TempDir()
	start := time.Now()
	d.MustCLI("cp", id+":/workspace/sparse", filepath.Join(out, "one"))
	d.MustCLI("cp", id+":/workspace/tree", filepath.Join(out, "tree"))
	t.Logf("two 1 GiB sparse copies out in %v", time.Since(start))
	for _, p := range []string{filepath.Join(out, "one"), filepath.Join(out, "tree", "sparse")} {
		n, alloc := blocks(p)
		if n != size || alloc > 1<<20 {
			t.Errorf("%s: %d bytes, %d allocated; want %d with holes", p, n, alloc, size)
		}
		f, _ := os.Open(p)
		b := make([]byte, 3)
		f.ReadAt(b, 512<<20)
		f.Close()
		if string(b) != "mid" {
			t.Errorf("%s: %q at 512 MiB", p, b)
		}
	}

	for _, args := range [][]string{
		{"cp", id + ":/workspace/huge", filepath.Join(out, "huge")},
		{"cp", id + ":/workspace", filepath.Join(out, "ws")},
		{"cp", "--max-size", "100m", id + ":/workspace/sparse", filepath.Join(out, "capped")},
		{"cp", "--max-size", "100m", id + ":/workspace/tree", filepath.Join(out, "cappedtree")},
	} {
		r := d.CLI(args...)
		if r.Code == 0 || !strings.Contains(r.Stderr, "--max-size") {
			t.Errorf("%q: exit %d, %s", args, r.Code, r.Stderr)
		}
	}
	for _, p := range []string{"huge", "capped", "ws/huge", "cappedtree/sparse"} {
		if _, err := os.Stat(filepath.Join(out, p)); err == nil {
			t.Errorf("%s was written past the cap", p)
		}
	}

	// Into the sandbox: a file and a tree, holes kept there too.
	local := t.TempDir()
	os.Mkdir(filepath.Join(local, "dir"), 0o755)
	for _, p := range []string{"in", "dir/in"} {
		f, err := os.Create(filepath.Join(local, p))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(size)
		f.WriteAt([]byte("tail"), size-4)
		f.Close()
	}
	d.MustCLI("cp", filepath.Join(local, "in"), id+":/workspace/in")
	d.MustCLI("cp", filepath.Join(local, "dir"), id+":/workspace/dir")
	stdout, stderr2, st2 := d.Exec(id, "sh", "-c", "stat -c '%s %b %B' /workspace/in /workspace/dir/in; tail -c 4 /workspace/in")
	if st2.ExitCode != 0 {
		t.Fatal(stderr2)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	for _, l := range lines[:2] {
		var n, b, bs int64
		fmt.Sscan(l, &n, &b, &bs)
		if n != size || b*bs > 1<<20 {
			t.Errorf("in the sandbox: %q (size, blocks, block size); want %d bytes with holes", l, size)
		}
	}
	if !strings.HasSuffix(stdout, "tail") {
		t.Errorf("the uploaded file ends %q", stdout)
	}
}
