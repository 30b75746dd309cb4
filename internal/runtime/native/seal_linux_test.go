package native

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSealRetriesWhileBusy: a guest binary's memfd that cannot be sealed
// for a while (here a writable mapping, which fails F_SEAL_WRITE with
// EBUSY as a held page does) is sealed once it can be; one that never
// can fails with EBUSY, after the tries.
func TestSealRetriesWhileBusy(t *testing.T) {
	memfd := func() (*os.File, []byte) {
		fd, err := unix.MemfdCreate("seal-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "seal-test")
		t.Cleanup(func() { f.Close() })
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
		m, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		return f, m
	}

	f, m := memfd()
	go func() {
		time.Sleep(3 * sealRetry / 2)
		unix.Munmap(m)
	}()
	if err := seal(f); err != nil {
		t.Fatalf("seal once the mapping is gone: %v", err)
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_WRITE == 0 {
		t.Fatalf("seals %#x, %v: want F_SEAL_WRITE", seals, err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("a sealed memfd took a write")
	}

	f, m = memfd()
	defer unix.Munmap(m)
	if err := seal(f); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("seal with a writable mapping kept: %v, want EBUSY", err)
	}
}
