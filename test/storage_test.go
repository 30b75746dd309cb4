package test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// TestVolumeSharing: a named volume outlives sandboxes, is shared between
// two of them (one read-only), keeps owners across their different uid
// ranges, enforces its size cap, and cannot be removed while mounted.
func TestVolumeSharing(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	if out := d.MustCLI("volume", "create", "shared", "--size", "64m", "-l", "team=a"); strings.TrimSpace(out) != "shared" {
		t.Fatalf("volume create printed %q", out)
	}
	if r := d.CLI("volume", "create", "shared"); r.Code == 0 || !strings.Contains(r.Stderr, "already exists") {
		t.Fatalf("duplicate volume create: exit %d, %s", r.Code, r.Stderr)
	}
	a := d.createCLI("--volume", "shared:/data")
	b := d.createCLI("--volume", "shared:/mnt/ro:ro")

	d.Sh(a, "echo hello > /data/greeting; mkdir /data/dir; chown 1000:1000 /data/dir; echo owned > /data/dir/f; chown 1000:1000 /data/dir/f")
	if got := d.Sh(b, "cat /mnt/ro/greeting; stat -c %u:%g /mnt/ro/dir/f"); got != "hello\n1000:1000\n" {
		t.Fatalf("reader sees %q", got)
	}
	// The two sandboxes have different host uid ranges, yet agree on owners.
	sa, sb := d.get(a), d.get(b)
	if sa.Runtime.UIDBase == sb.Runtime.UIDBase {
		t.Fatalf("both sandboxes have uid base %d", sa.Runtime.UIDBase)
	}
	if r := d.sh(b, "echo no > /mnt/ro/x"); r.ExitCode == 0 || !strings.Contains(r.Stderr, "Read-only") {
		t.Fatalf("write to a read-only volume: %s", r)
	}
	// A writer in b's sandbox as uid 1000 on a's files: owners are real.
	// The cap: 64 MiB.
	if r := d.sh(a, "dd if=/dev/zero of=/data/big bs=1M count=100"); r.ExitCode == 0 || !strings.Contains(r.Stderr, "No space left") {
		t.Fatalf("writing past the volume's cap: %s", r)
	}
	d.Sh(a, "rm /data/big")
	v, err := c.GetVolume(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.UsedBy) != 2 || v.SizeBytes != 64<<20 || v.Labels["team"] != "a" {
		t.Fatalf("volume: %+v", v)
	}
	// Not removable while mounted.
	if err := c.DeleteVolume(ctx, "shared"); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("removing a mounted volume: %v", err)
	}
	// Unknown volume, bad mounts.
	for _, req := range []api.CreateRequest{
		{Volumes: []api.VolumeMount{{Name: "nope", Path: "/x"}}},
		{Volumes: []api.VolumeMount{{Name: "shared", Path: "relative"}}},
		{Volumes: []api.VolumeMount{{Name: "shared", Path: "/"}}},
		{Volumes: []api.VolumeMount{{Name: "shared", Path: "/proc/x"}}},
		{Volumes: []api.VolumeMount{{Name: "shared", Path: "/a"}, {Name: "shared", Path: "/a"}}},
		{Volumes: []api.VolumeMount{{Name: "../etc", Path: "/a"}}},
	} {
		if _, err := c.Create(ctx, req); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("create with %+v: %v", req.Volumes, err)
		}
	}
	for _, name := range []string{"UPPER", "a/b", "..", strings.Repeat("x", 65)} {
		if _, err := c.CreateVolume(ctx, api.VolumeRequest{Name: name}); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("volume name %q: %v", name, err)
		}
	}

	// The volume outlives both sandboxes, and across a daemon restart.
	for _, id := range []string{a, b} {
		if err := c.Delete(ctx, id, true); err != nil {
			t.Fatal(err)
		}
	}
	d.Kill9()
	d.Start()
	c = d.Client()
	e := d.createCLI("--volume", "shared:/again")
	if got := d.Sh(e, "cat /again/greeting"); got != "hello\n" {
		t.Fatalf("after restart: %q", got)
	}
	if err := c.Delete(ctx, e, true); err != nil {
		t.Fatal(err)
	}
	d.MustCLI("volume", "rm", "shared")
	if list, _ := c.Volumes(ctx); len(list) != 0 {
		t.Fatalf("volumes after rm: %+v", list)
	}
}

// writerScript appends numbered, fixed-size records to a file as fast as
// it can, each in one write.
const writerScript = `i=0; while :; do printf 'record %08d %s\n' $i 0123456789012345678901234567890123456789 >> /workspace/log; i=$((i+1)); done`

// checkRecords verifies that the log in sandbox id is an unbroken run of
// complete records from 0 and returns how many there are.
func checkRecords(t *testing.T, d *Daemon, id string) int {
	t.Helper()
	out := d.Sh(id, `awk 'BEGIN{n=0} { if ($1 != "record" || $2+0 != n || length($0) != 56) { print "bad line " NR ": " $0; exit 1 } n++ } END { print n }' /workspace/log`)
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("checking records: %q", out)
	}
	return n
}

// TestSnapshotWhileWriting: a snapshot of a sandbox whose process writes
// continuously is a clean filesystem holding a consistent prefix of the
// writes; the sandbox keeps running and writing; a sandbox made from the
// snapshot starts with the captured files, env and workdir.
func TestSnapshotWhileWriting(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{Env: map[string]string{"FROM": "source"}, Workdir: "/workspace"})
	if _, err := c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"sh", "-c", writerScript}}); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, 10*time.Millisecond, func() bool {
		return d.sh(id, "test $(wc -l < /workspace/log) -gt 1000").ExitCode == 0
	}) {
		t.Fatal("the writer did not write")
	}
	out := d.CLI("snapshot", id, "--verbose", "-l", "k=v")
	if out.Code != 0 {
		t.Fatalf("snapshot: %s %s", out.Stdout, out.Stderr)
	}
	snapID := strings.TrimSpace(out.Stdout)
	snap, err := c.GetSnapshot(ctx, snapID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot %s: frozen %.1f ms, total %.1f ms, shared %v", snap.ID, snap.FrozenMS, snap.TotalMS, snap.Shared)
	if snap.Sandbox != id || snap.FrozenMS <= 0 || snap.TotalMS < snap.FrozenMS || snap.Labels["k"] != "v" || snap.Env["FROM"] != "source" {
		t.Fatalf("snapshot: %+v", snap)
	}
	// The image is a clean ext4 filesystem.
	img := filepath.Join(d.StateDir, "storage", "snapshots", snapID, "disk.img")
	if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck of the snapshot: %v\n%s", err, out)
	}
	// The source still runs and writes.
	n1 := d.Sh(id, "wc -l < /workspace/log")
	time.Sleep(50 * time.Millisecond)
	if n2 := d.Sh(id, "wc -l < /workspace/log"); n2 == n1 {
		t.Fatal("the source stopped writing after the snapshot")
	}
	if st := state(t, c, id); st != api.StateRunning {
		t.Fatalf("source is %s", st)
	}

	copyID := d.createCLI("--from", snapID, "-e", "EXTRA=1")
	n := checkRecords(t, d, copyID)
	if n < 1000 {
		t.Fatalf("the copy has only %d records", n)
	}
	if got := d.Sh(copyID, "echo $FROM $EXTRA; pwd"); got != "source 1\n/workspace\n" {
		t.Fatalf("copy env/workdir: %q", got)
	}
	// The copy is its own: its writes do not reach the source.
	d.Sh(copyID, "echo mine > /workspace/copy-only")
	if r := d.sh(id, "test -e /workspace/copy-only"); r.ExitCode == 0 {
		t.Fatal("a write in the copy reached the source")
	}
	sb := d.get(copyID)
	if sb.From != snapID {
		t.Fatalf("copy's from = %q", sb.From)
	}

	// List and remove; unknown and malformed ids.
	if ls := d.MustCLI("snapshot", "ls", "-q"); strings.TrimSpace(ls) != snapID {
		t.Fatalf("snapshot ls: %q", ls)
	}
	if _, err := c.GetSnapshot(ctx, "snap-000000000000"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("unknown snapshot: %v", err)
	}
	if _, err := c.Create(ctx, api.CreateRequest{From: "snap-000000000000"}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("create from an unknown snapshot: %v", err)
	}
	if a := d.do("GET", "/v1/snapshots/..%2f..%2fetc", ""); a.Status != 400 {
		t.Fatalf("path-like snapshot id: %d", a.Status)
	}
	d.MustCLI("snapshot", "rm", snapID)
	if _, err := os.Stat(filepath.Dir(img)); !os.IsNotExist(err) {
		t.Fatalf("snapshot files remain after rm: %v", err)
	}
	// The copy does not depend on the removed snapshot.
	if got := d.Sh(copyID, "cat /workspace/copy-only"); got != "mine\n" {
		t.Fatalf("copy after snapshot rm: %q", got)
	}
}

// TestForkTen: ten forks of a running sandbox each start with its files
// and are independent of it and of each other.
func TestForkTen(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{Labels: map[string]string{"app": "x"}})
	d.Sh(id, "echo original > /workspace/state; head -c 8M /dev/urandom > /workspace/blob; sha256sum /workspace/blob > /workspace/blob.sum")
	r := d.CLI("fork", id, "-n", "10", "--verbose")
	if r.Code != 0 {
		t.Fatalf("fork: %s %s", r.Stdout, r.Stderr)
	}
	t.Logf("fork x10: %s", strings.TrimSpace(r.Stderr))
	forks := lines(r.Stdout)
	if len(forks) != 10 {
		t.Fatalf("fork printed %d ids: %q", len(forks), r.Stdout)
	}
	var wg sync.WaitGroup
	for _, f := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, _, st := d.Exec(f, "sh", "-c", "cat /workspace/state; cd /workspace && sha256sum -c blob.sum >/dev/null && echo ok; echo "+f+" > /workspace/state")
			if st.ExitCode != 0 || out != "original\nok\n" {
				t.Errorf("fork %s: exit %d, %q", f, st.ExitCode, out)
			}
		}()
	}
	wg.Wait()
	for _, f := range forks {
		if got := d.Sh(f, "cat /workspace/state"); got != f+"\n" {
			t.Errorf("fork %s sees %q", f, got)
		}
		sb := d.get(f)
		if sb.Labels["app"] != "x" || sb.Labels["paddock.fork-of"] != id || sb.State != api.StateRunning {
			t.Errorf("fork %s: %+v", f, sb)
		}
	}
	if got := d.Sh(id, "cat /workspace/state"); got != "original\n" {
		t.Fatalf("source sees %q", got)
	}
	// The fork's capture is not left behind.
	if list, _ := c.Snapshots(ctx, ""); len(list) != 0 {
		t.Fatalf("snapshots after fork: %+v", list)
	}
	if _, err := c.Fork(ctx, id, api.ForkRequest{Count: 65}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("fork x65: %v", err)
	}
}

// TestDirectorySnapshot: one directory is captured with its merged
// content (files, links, owners, deletions of image files), mounted
// read-only into another sandbox, copied into a writable volume, and held
// while mounted. A hostile symlink cannot make the host copy its files.
func TestDirectorySnapshot(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{})
	d.Sh(id, `set -e
mkdir -p /workspace/proj/sub
echo a > /workspace/proj/a
ln /workspace/proj/a /workspace/proj/hard
ln -s a /workspace/proj/soft
ln -s /etc/shadow /workspace/proj/escape
echo b > /workspace/proj/sub/b
chown -R 1000:1000 /workspace/proj/sub
echo gone > /workspace/proj/deleted; rm /workspace/proj/deleted
ln -s / /workspace/rootlink`)
	r := d.CLI("snapshot", id, "--path", "/workspace/proj")
	if r.Code != 0 {
		t.Fatalf("directory snapshot: %s %s", r.Stdout, r.Stderr)
	}
	snapID := strings.TrimSpace(r.Stdout)
	snap, err := c.GetSnapshot(ctx, snapID)
	if err != nil || snap.Path != "/workspace/proj" {
		t.Fatalf("snapshot %+v, %v", snap, err)
	}
	// A later change in the source is not in the snapshot.
	d.Sh(id, "echo later > /workspace/proj/later")

	reader := d.createCLI("--volume", snapID+":/src")
	got := d.Sh(reader, `cd /src && ls -A | sort | tr '\n' ' '; echo; cat a hard sub/b; readlink soft escape; stat -c '%u %h' sub/b a`)
	want := "a escape hard soft sub \na\na\nb\na\n/etc/shadow\n1000 1\n0 2\n"
	if got != want {
		t.Fatalf("directory snapshot content:\n%s\nwant:\n%s", got, want)
	}
	if r := d.sh(reader, "touch /src/x"); r.ExitCode == 0 {
		t.Fatal("a mounted directory snapshot is writable")
	}
	if err := c.DeleteSnapshot(ctx, snapID); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("removing a mounted snapshot: %v", err)
	}
	// A writable copy as a volume.
	d.MustCLI("volume", "create", "proj-copy", "--from-snapshot", snapID)
	writer := d.createCLI("--volume", "proj-copy:/proj")
	d.Sh(writer, "echo changed > /proj/a; test -f /proj/sub/b")
	if got := d.Sh(reader, "cat /src/a"); got != "a\n" {
		t.Fatalf("the snapshot changed with its copy: %q", got)
	}

	// Paths that are not directories of the sandbox, or escape it.
	for _, p := range []string{"/workspace/rootlink", "/workspace/proj/a", "/nonexistent", "/", "relative", "/workspace/../etc"} {
		if _, err := c.Snapshot(ctx, id, api.SnapshotRequest{Path: p}); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("directory snapshot of %q: %v", p, err)
		}
	}
	for _, s := range []string{reader, writer} {
		if err := c.Delete(ctx, s, true); err != nil {
			t.Fatal(err)
		}
	}
	d.MustCLI("snapshot", "rm", snapID)
	d.MustCLI("volume", "rm", "proj-copy")
}

// TestSnapshotDiskFull: a directory snapshot that does not fit on the
// host's storage fails with a clear error, leaves nothing behind and the
// sandbox running.
func TestSnapshotDiskFull(t *testing.T) {
	d := StartDaemon(t, "--storage-size", "768m", "--disk-pool", "0", "--warm-guests", "0")
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{Resources: api.Resources{DiskBytes: 600 << 20}})
	d.Sh(id, "mkdir /workspace/big && head -c 450M /dev/urandom > /workspace/big/data && sync")
	_, err := c.Snapshot(ctx, id, api.SnapshotRequest{Path: "/workspace/big"})
	if !errors.Is(err, client.ErrNoSpace) {
		t.Fatalf("snapshot on a full disk: %v", err)
	}
	t.Logf("error: %v", err)
	if list, _ := c.Snapshots(ctx, ""); len(list) != 0 {
		t.Fatalf("snapshots after a failed one: %+v", list)
	}
	ents, _ := os.ReadDir(filepath.Join(d.StateDir, "storage", "snapshots"))
	if len(ents) != 0 {
		t.Fatalf("snapshot files after a failed one: %v", ents)
	}
	if st := state(t, c, id); st != api.StateRunning {
		t.Fatalf("sandbox is %s", st)
	}
	d.Sh(id, "rm /workspace/big/data; echo alive > /workspace/after")
	// With room again, a snapshot works.
	if _, err := c.Snapshot(ctx, id, api.SnapshotRequest{}); err != nil {
		t.Fatalf("snapshot after freeing space: %v", err)
	}
}
