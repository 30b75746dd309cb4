package native

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
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

// TestSealedSelfRunsUnderMemfdNoexec: on a host whose vm.memfd_noexec is
// 1 (memfds not executable unless made with MFD_EXEC), the guest binary's
// memfd still runs. The sysctl is set in a pid namespace of the test's
// own (it is per pid namespace), by the test binary re-run there.
func TestSealedSelfRunsUnderMemfdNoexec(t *testing.T) {
	if os.Getenv("PADDOCK_TEST_MEMFD_NOEXEC") == "1" {
		if err := os.WriteFile("/proc/sys/vm/memfd_noexec", []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
		f, err := sealedSelf("/bin/true")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd := exec.Command("/proc/self/fd/3")
		cmd.ExtraFiles = []*os.File{f}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("running the sealed copy of /bin/true: %v %s", err, out)
		}
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for a pid namespace")
	}
	if _, err := os.Stat("/proc/sys/vm/memfd_noexec"); err != nil {
		t.Skip("no vm.memfd_noexec on this kernel (before 6.3)")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1)")
	}
	cmd := exec.Command(unshare, "--pid", "--fork", "--mount-proc", os.Args[0], "-test.run", "^TestSealedSelfRunsUnderMemfdNoexec$", "-test.v")
	cmd.Env = append(os.Environ(), "PADDOCK_TEST_MEMFD_NOEXEC=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in a pid namespace with vm.memfd_noexec=1: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS")) {
		t.Fatalf("the child test did not pass:\n%s", out)
	}
}
