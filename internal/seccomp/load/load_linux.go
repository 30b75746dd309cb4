package load

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// InsnSize is sizeof(struct sock_filter): u16 code, u8 jt, u8 jf, u32 k.
const InsnSize = 8

// Thread installs prog, a program from seccomp.Compile, as a seccomp filter with
// seccomp(SECCOMP_SET_MODE_FILTER, 0, &sock_fprog). It does not call
// libseccomp (the guest never needs it) and is safe to call with the Go
// runtime running.
//
// A filter belongs to a thread, not a process: it applies to the calling
// thread, to the processes and threads that thread creates afterwards, and
// across execve; it cannot be removed. Other threads of the process are not
// filtered, and Go starts new threads from an unfiltered template thread,
// never from a locked one. So call Thread from a goroutine that holds
// runtime.LockOSThread and then execve (or only fork/exec) from that same
// goroutine; after the exec the whole new image runs under the filter. That
// is also why no TSYNC is asked for.
//
// The thread must have no_new_privs set (prctl(PR_SET_NO_NEW_PRIVS, 1) on the
// same thread: the bit is per thread too) or hold CAP_SYS_ADMIN; otherwise the
// kernel refuses with EACCES, reported as errdefs.ErrDenied.
//
// Flags are 0, as runc and Docker load the default profile. In particular no
// SECCOMP_FILTER_FLAG_SPEC_ALLOW: where the host boots with
// spec_store_bypass_disable=seccomp the sandbox keeps the speculative store
// bypass mitigation, which is what untrusted code should get. With the
// kernel's default (prctl) the flag changes nothing.
func Thread(prog []byte) error { return load(prog, 0) }

// AllThreads installs prog on every thread of the process at once
// (SECCOMP_FILTER_FLAG_TSYNC), and sets no_new_privs on all of them when
// the calling thread has it. The guest uses it once its sandbox is built:
// from then on the guest itself, every thread Go starts later, and every
// process it forks run under the filter. The calling thread needs
// no_new_privs or CAP_SYS_ADMIN, as for Thread.
func AllThreads(prog []byte) error { return load(prog, unix.SECCOMP_FILTER_FLAG_TSYNC) }

func load(prog []byte, flags uintptr) error {
	n := len(prog) / InsnSize
	if n == 0 || len(prog)%InsnSize != 0 || n > unix.BPF_MAXINSNS {
		return errdefs.Invalid("seccomp program", "%d bytes is not 1 to %d sock_filter instructions", len(prog), unix.BPF_MAXINSNS)
	}
	// Copy into a []SockFilter so the instructions are aligned as the kernel
	// reads them; the byte layout is already the native struct's.
	insns := make([]unix.SockFilter, n)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&insns[0])), len(prog)), prog)
	fprog := unix.SockFprog{Len: uint16(n), Filter: &insns[0]}

	r1, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(insns)
	switch {
	case errno == 0 && r1 != 0:
		// With TSYNC, a positive result names a thread that could not be
		// synchronised (it already has a different filter).
		return fmt.Errorf("installing seccomp filter: thread %d could not be synchronised", r1)
	case errno == 0:
		return nil
	case errors.Is(errno, unix.EACCES):
		return fmt.Errorf("%w: installing seccomp filter: no_new_privs is not set on this thread and it lacks CAP_SYS_ADMIN", errdefs.ErrDenied)
	case errors.Is(errno, unix.EINVAL):
		return fmt.Errorf("%w: installing seccomp filter: kernel rejected the program: %w", errdefs.ErrInvalid, errno)
	}
	return fmt.Errorf("installing seccomp filter: %w", errno)
}
