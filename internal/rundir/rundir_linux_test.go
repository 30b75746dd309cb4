package rundir

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// diskDir makes a directory on a disk filesystem, or skips the test
// where the temp dir is in memory already.
func diskDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.TMPFS_MAGIC {
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
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestMountEmptyDiskDir(t *testing.T) {
	dir := diskDir(t)
	inMemory, err := Mount(dir, quiet)
	if err != nil || !inMemory {
		t.Fatalf("Mount(empty disk dir) = %v, %v; want true, nil", inMemory, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Fatalf("after Mount the dir is not a tmpfs (type %#x, %v)", st.Type, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "paddock.pid"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A second start finds the tmpfs and mounts nothing over it.
	if inMemory, err := Mount(dir, quiet); err != nil || !inMemory {
		t.Fatalf("second Mount = %v, %v; want true, nil", inMemory, err)
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
	inMemory, err := Mount(dir, quiet)
	if err != nil || inMemory {
		t.Fatalf("Mount(non-empty disk dir) = %v, %v; want false, nil", inMemory, err)
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
