package test

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// TestDiskSpaceBacked: a daemon whose state directory is on a small
// filesystem (768 MiB of ext4; the storage is an XFS image on it). Two
// sandboxes get disks of 256 MiB; a third, which the filesystem could not
// back next to them, is refused with 503 naming the disk. Then a neighbour
// takes nearly all the host filesystem's free space, and both sandboxes
// write until their disks are full: each writer gets ENOSPC at its own cap
// (not an I/O error), and what it wrote is on its disk (read back with
// O_DIRECT after a sync). The sandbox's stats show the storage's real free
// space. Before (issue 20.5) the disks were sparse files: the third create
// was admitted, and the writes the host could not hold were lost on the
// loop devices while dd and sync reported success.
func TestDiskSpaceBacked(t *testing.T) {
	t.Parallel()
	// Unmounted after the daemon's cleanup (cleanups run last first).
	var unmount func()
	t.Cleanup(func() {
		if unmount != nil {
			unmount()
		}
	})
	d := prepareDaemon(t, "--disk-pool", "0", "--warm-guests", "0", "--disk-overcommit", "1")
	unmount = smallFilesystem(t, d.StateDir, 768<<20)
	d.Start()
	if err := os.Chmod(d.Root, 0o711); err != nil {
		t.Fatal(err)
	}
	disk := api.Resources{CPUs: 0.5, MemoryBytes: 256 << 20, DiskBytes: 256 << 20}
	a := d.Create(api.CreateRequest{Resources: disk})
	b := d.Create(api.CreateRequest{Resources: disk})
	_, err := d.Client().Create(t.Context(), api.CreateRequest{Resources: disk})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "disk") {
		t.Errorf("a third disk the storage cannot back: %v, want 503 naming the disk", err)
	}

	// The storage's free space, as stats show it.
	m, err := d.Client().Metrics(t.Context(), a, client.MetricsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d.StateDir, &st); err != nil {
		t.Fatal(err)
	}
	hostFree := int64(st.Bavail) * st.Bsize
	if s := m.Storage; s == nil {
		t.Errorf("stats show no storage space: %+v", m)
	} else {
		t.Logf("storage: %+v; host filesystem: %d MiB free", *s, hostFree>>20)
		if s.FreeBytes > hostFree || s.FreeBytes >= disk.DiskBytes || s.HostFreeBytes < hostFree-(16<<20) || s.HostFreeBytes > hostFree+(16<<20) {
			t.Errorf("stats: free %d, host free %d; the host filesystem has %d free", s.FreeBytes, s.HostFreeBytes, hostFree)
		}
	}
	var out Result
	if !waitFor(15*time.Second, 200*time.Millisecond, func() bool {
		out = d.CLI("stats", a) // once the sandbox is sampled
		return strings.Contains(out.Stdout, "storage")
	}) {
		t.Errorf("paddock stats shows no storage line:\n%s%s", out.Stdout, out.Stderr)
	}

	// A neighbour takes the host filesystem's space, bar 16 MiB.
	filler, err := os.Create(filepath.Join(d.StateDir, "neighbour"))
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(filler.Name())
	if err := unix.Statfs(d.StateDir, &st); err != nil {
		t.Fatal(err)
	}
	if n := int64(st.Bavail)*st.Bsize - 16<<20; n > 0 {
		if err := unix.Fallocate(int(filler.Fd()), 0, 0, n); err != nil {
			t.Fatalf("filling the host filesystem: %v", err)
		}
	}
	filler.Close()

	for _, id := range []string{a, b} {
		r := d.sh(id, `dd if=/dev/urandom of=/fill bs=1M 2>/tmp/dd.err; echo "dd $?"; cat /tmp/dd.err; sync -f /fill && echo synced`)
		t.Logf("%s: %s", id, r.Stdout)
		if !strings.Contains(r.Stdout, "dd 1") || !strings.Contains(r.Stdout, "No space left on device") || !strings.Contains(r.Stdout, "synced") {
			t.Errorf("%s: writing until the disk is full: %q, want dd to fail with ENOSPC and the sync to succeed", id, r.Stdout)
		}
		sums := d.sh(id, `wc -c < /fill; sha256sum < /fill; dd if=/fill iflag=direct bs=1M 2>/dev/null | sha256sum`)
		f := strings.Fields(sums.Stdout)
		if len(f) != 5 || f[1] != f[3] {
			t.Errorf("%s: the file as written and as on its disk: %q, want the same checksum", id, sums.Stdout)
		}
		if len(f) > 0 && f[0] < "2" {
			t.Errorf("%s: only %s bytes written", id, f[0])
		}
	}
	if log := d.Log(); strings.Contains(log, "I/O error") {
		t.Errorf("the daemon saw I/O errors")
	}
	if out, _ := exec.Command("dmesg").Output(); strings.Contains(string(out), "potential data loss") {
		t.Logf("dmesg reports data loss (maybe another test's)")
	}
}

// smallFilesystem makes a new ext4 filesystem of size bytes, mounts it
// outside the daemon's root (whose mounts its cleanup counts as leaks) and
// makes dir a symlink into it. The caller unmounts it with the function
// returned, once the daemon is done with it.
func smallFilesystem(t *testing.T, dir string, size int64) (unmount func()) {
	t.Helper()
	mnt, err := os.MkdirTemp("", "paddock-smallfs-")
	if err != nil {
		t.Fatal(err)
	}
	img := mnt + ".ext4"
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	unmount = func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting the small filesystem: %v", err)
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
		os.Remove(mnt)
		os.Remove(img)
	}
	state := filepath.Join(mnt, "state")
	if err := os.Mkdir(state, 0o711); err != nil {
		unmount()
		t.Fatal(err)
	}
	if err := os.Symlink(state, dir); err != nil {
		unmount()
		t.Fatal(err)
	}
	return unmount
}
