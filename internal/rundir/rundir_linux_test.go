package rundir

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/mountinfo"
)

// diskDir makes a directory on a disk filesystem, or skips the test
// where the temp dir is in memory already.
func diskDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	if inMemory(t, dir) {
		t.Skip("the temp dir is on a tmpfs: nothing to mount")
	}
	t.Cleanup(func() {
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	return dir
}

// mountsAt counts the mounts whose mount point is dir.
func mountsAt(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if m, ok := mountinfo.Parse(line); ok && m.Point == dir {
			n++
		}
	}
	return n
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// inMemory reports whether dir is on a tmpfs.
func inMemory(t *testing.T, dir string) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Type == unix.TMPFS_MAGIC
}

func TestMountEmptyDiskDir(t *testing.T) {
	dir := diskDir(t)
	if err := Mount(dir, quiet); err != nil {
		t.Fatalf("Mount(empty disk dir): %v", err)
	}
	if !inMemory(t, dir) {
		t.Fatal("after Mount the dir is not a tmpfs")
	}
	if err := os.WriteFile(filepath.Join(dir, "paddock.pid"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A second start finds the tmpfs and mounts nothing over it.
	if err := Mount(dir, quiet); err != nil || !inMemory(t, dir) {
		t.Fatalf("second Mount: %v (in memory: %v)", err, inMemory(t, dir))
	}
	if n := mountsAt(t, dir); n != 1 {
		t.Fatalf("%d mounts at %s after two starts, want 1", n, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "paddock.pid")); err != nil {
		t.Fatalf("the first start's file is hidden: %v", err)
	}
	if err := Unmount(dir); err != nil {
		t.Fatal(err)
	}
	if n := mountsAt(t, dir); n != 0 {
		t.Fatalf("%d mounts at %s after Unmount, want 0", n, dir)
	}
	// Nothing was written to the disk under it.
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("the disk dir holds %v (%v) after Unmount, want nothing", ents, err)
	}
	if err := Unmount(dir); err != nil {
		t.Fatalf("Unmount of a dir without a tmpfs: %v", err)
	}
}

func TestMountKeepsEarlierFiles(t *testing.T) {
	dir := diskDir(t)
	if err := os.Mkdir(filepath.Join(dir, "sandboxes"), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := Mount(dir, quiet); err != nil || inMemory(t, dir) {
		t.Fatalf("Mount(non-empty disk dir): %v (in memory: %v); want nil, false", err, inMemory(t, dir))
	}
	if n := mountsAt(t, dir); n != 0 {
		t.Fatalf("%d mounts over an earlier daemon's files, want 0", n)
	}
}

func TestUnmountLeavesForeignTmpfs(t *testing.T) {
	dir := diskDir(t)
	if err := unix.Mount("operator", dir, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(dir); err != nil {
		t.Fatal(err)
	}
	if n := mountsAt(t, dir); n != 1 {
		t.Fatalf("Unmount took down a tmpfs it did not mount (%d mounts left, want 1)", n)
	}
	if err := Unmount(filepath.Join(dir, "gone")); err != nil {
		t.Fatalf("Unmount of a missing dir: %v", err)
	}
}
