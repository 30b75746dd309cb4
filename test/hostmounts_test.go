package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
)

// TestGuestsHoldNoHostMounts: a loop device mounted on the host while a
// daemon forks its warm and blank guests (and its forker starts) is
// released once the host unmounts and detaches it. Guests forked from a
// copy of the host's mount table kept such a mount, and its loop device,
// alive while they waited in their pools: another daemon's disks, a
// test's, an operator's.
func TestGuestsHoldNoHostMounts(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	mnt := filepath.Join(dir, "mnt-"+randHex(4))
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("truncate", "-s", "16M", img)
	run("mkfs.ext4", "-q", img)
	loop := run("losetup", "--find", "--show", img)
	backing := filepath.Join("/sys/block", filepath.Base(loop), "loop", "backing_file")
	mounted := false
	t.Cleanup(func() {
		if mounted {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		exec.Command("losetup", "-d", loop).Run()
	})
	if err := unix.Mount(loop, mnt, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	mounted = true

	// The daemon starts its forker and fills its pools while the mount
	// exists; a create makes it fork more.
	d := StartDaemon(t)
	if !waitFor(30*time.Second, 100*time.Millisecond, func() bool { return len(d.guestPIDs()) >= 4 }) {
		t.Fatalf("the daemon's pools did not fill: %d guests", len(d.guestPIDs()))
	}
	id := d.Create(api.CreateRequest{})
	if !waitFor(30*time.Second, 100*time.Millisecond, func() bool { return len(d.guestPIDs()) >= 5 }) {
		t.Fatalf("the daemon's pools did not refill: %d guests", len(d.guestPIDs()))
	}
	if out := d.run(id, "", "true"); out.ExitCode != 0 {
		t.Fatalf("a sandbox made beside a host mount: %s", out)
	}

	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	run("losetup", "-d", loop)
	released := waitFor(5*time.Second, 50*time.Millisecond, func() bool {
		_, err := os.Stat(backing)
		return os.IsNotExist(err)
	})
	if holders := mountHolders(mnt); len(holders) > 0 || !released {
		t.Fatalf("%s still backed by %s after the host unmounted and detached it; holders of %s: %v", loop, img, mnt, holders)
	}
}

// guestPIDs lists the host processes in the daemon's first uid ranges:
// its guests, warm, blank or bound.
func (d *Daemon) guestPIDs() []int {
	var pids []int
	for i := range uint32(16) {
		pids = append(pids, pidsInUIDRange(d.UIDStart+i*65536)...)
	}
	return pids
}

// mountHolders describes every host process whose mount table still has
// a mount at path.
func mountHolders(path string) []string {
	entries, _ := os.ReadDir("/proc")
	var holders []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "mountinfo"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && f[4] == path {
				holders = append(holders, describe(pid))
				break
			}
		}
	}
	return holders
}
