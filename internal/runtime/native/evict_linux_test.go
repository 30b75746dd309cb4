package native

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/seccomp"
	"github.com/paddock-dev/paddock/internal/storage/disk"
	"github.com/paddock-dev/paddock/internal/storage/image"
	"golang.org/x/sys/unix"
)

// TestRefusedStartEvictsWarm: on a storage filesystem of 1 GiB whose
// space the warm pool's three fallocated 256 MiB disks mostly hold, a
// start asking a 512 MiB disk is refused for space, evicts the warm
// guests and starts: pools never make a real create fail.
func TestRefusedStartEvictsWarm(t *testing.T) {
	d := nativeDeps(t, "paddock-evict")
	log, img := d.log, d.img
	dir := t.TempDir()
	storage := filepath.Join(dir, "storage")
	if err := os.Mkdir(storage, 0o700); err != nil {
		t.Fatal(err)
	}
	// An ext4 of its own (tmpfs cannot map a disk's extents), on a loop
	// device that its unmount frees.
	fsImage := filepath.Join(dir, "storage.img")
	for _, args := range [][]string{
		{"truncate", "-s", "1G", fsImage},
		{"mkfs.ext4", "-q", fsImage},
		{"mount", "-o", "loop", fsImage, storage},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	t.Cleanup(func() {
		if err := unix.Unmount(storage, 0); err != nil {
			t.Errorf("unmounting %s: %v", storage, err)
		}
	})
	disks, err := disk.NewPool(disk.Config{Dir: filepath.Join(storage, "disks"), DefaultSize: 256 << 20, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { disks.Close() })
	rt, err := New(Config{
		RunDir:        filepath.Join(dir, "run"),
		Cgroups:       d.cgroups,
		Disks:         disks,
		IDs:           &testIDs{start: 3<<30 + 128<<16 + uint32(rand.IntN(64))*64<<16, n: 64},
		Seccomp:       d.prog,
		Caps:          seccomp.DockerDefaultCaps,
		GuestBinary:   d.bin,
		Logger:        log,
		WarmGuests:    3,
		WarmImage:     func() (*image.Image, error) { return img, nil },
		WarmDiskBytes: 256 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	name := "image:" + img.Name
	for deadline := time.Now().Add(time.Minute); rt.PoolSizes()[name] < 3; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the pool holds %d warm guests after a minute, not 3", rt.PoolSizes()[name])
		}
	}

	inst, err := rt.Start(context.Background(), runtime.Spec{Image: img, Resources: api.Resources{DiskBytes: 512 << 20}})
	if err != nil {
		t.Fatalf("a start the warm guests' disks crowded out: %v", err)
	}
	if err := rt.Remove(context.Background(), inst.ID()); err != nil {
		t.Errorf("removing %s: %v", inst.ID(), err)
	}
}
