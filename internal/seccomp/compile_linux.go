package seccomp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	profiles "github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// DockerDefaultCaps is Docker's default capability set, in the "CAP_X"
// spelling that the profile's includes and excludes use.
var DockerDefaultCaps = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FSETID",
	"CAP_FOWNER",
	"CAP_MKNOD",
	"CAP_NET_RAW",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_SETFCAP",
	"CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT",
	"CAP_KILL",
	"CAP_AUDIT_WRITE",
}

// SandboxCaps are the capabilities a sandbox's processes get: Docker's
// default set without CAP_NET_RAW (as Podman). An agent's work needs no
// raw or packet sockets (crafting frames, sniffing its link); ping still
// works through unprivileged ICMP sockets, which the guest enables in the
// sandbox's network namespace (net.ipv4.ping_group_range).
var SandboxCaps = slices.DeleteFunc(slices.Clone(DockerDefaultCaps), func(c string) bool { return c == "CAP_NET_RAW" })

// Profile expands Docker's default profile for a sandbox holding caps (its
// bounding set), on this host's architecture and kernel: rules the caps
// unlock are added (mount with CAP_SYS_ADMIN, ...), rules for other arches
// and newer kernels dropped.
func Profile(caps []string) (*specs.LinuxSeccomp, error) {
	for _, c := range caps {
		// The profile matches names exactly; "SYS_ADMIN" would silently
		// leave out the rules it unlocks.
		if !strings.HasPrefix(c, "CAP_") || strings.ToUpper(c) != c {
			return nil, errdefs.Invalid("caps", "%q is not in the CAP_X spelling", c)
		}
	}
	rs := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding:  caps,
		Effective: caps,
		Permitted: caps,
	}}}
	p, err := profiles.GetDefaultProfile(rs)
	if err != nil {
		return nil, fmt.Errorf("expanding default seccomp profile: %w", err)
	}
	// Without x32: Docker allows its syscalls where the kernel has the
	// ABI, which few distributions' kernels build (this host's has not:
	// every x32 call was ENOSYS anyway). Its rules were 376 of the
	// program's 1301 instructions, and the kernel converts and compiles
	// every instruction again for each sandbox: 342 µs a load against
	// 499 (issue 21). An x32 call gets ENOSYS (CompileSpec's bad-arch
	// action), as on a kernel without the ABI.
	p.Architectures = slices.DeleteFunc(p.Architectures, func(a specs.Arch) bool { return a == specs.ArchX32 })
	return p, nil
}

// Compile expands Docker's default profile for caps on this host's arch and
// kernel and compiles it to a classic BPF program: the bytes of a
// []struct sock_filter, 8 bytes per instruction, native endian, ready for
// Load. The result depends only on caps, the arch, the kernel's major.minor
// and the libseccomp version, so the daemon compiles once at start.
func Compile(caps []string) ([]byte, error) {
	p, err := Profile(caps)
	if err != nil {
		return nil, err
	}
	prog, _, err := CompileSpec(p)
	return prog, err
}

// CompileSpec compiles an OCI seccomp config to a classic BPF program the way
// runc builds its filter. Syscall names this libseccomp does not know are
// left out, as runc does, and returned in skipped, each once, in profile
// order; they get the default action (EPERM in Docker's profile). runc also
// patches its program so that syscall numbers beyond libseccomp's table get
// ENOSYS, letting libc fall back; this program does not, so a libseccomp that
// lags the sandbox's libc turns those fallbacks into EPERM. Unlike
// runc's, a call of an arch the config does not name gets ENOSYS rather
// than the thread killed.
//
// Flags are a property of loading, not of the program, and Load sets none,
// so a config with flags other than TSYNC is refused, as are notify actions
// (they need a listener fd that Load does not return).
func CompileSpec(s *specs.LinuxSeccomp) (prog []byte, skipped []string, err error) {
	if s == nil {
		return nil, nil, errdefs.Invalid("seccomp", "no profile")
	}
	for _, f := range s.Flags {
		// TSYNC is meaningless here: Load filters one thread that then execs.
		if f != "SECCOMP_FILTER_FLAG_TSYNC" {
			return nil, nil, errdefs.Invalid("seccomp.flags", "%s is not supported", f)
		}
	}
	defAct, err := action(s.DefaultAction, s.DefaultErrnoRet)
	if err != nil {
		return nil, nil, errdefs.Invalid("seccomp.defaultAction", "%v", err)
	}
	filter, err := libseccomp.NewFilter(defAct)
	if err != nil {
		return nil, nil, fmt.Errorf("creating seccomp filter: %w", err)
	}
	defer filter.Release()

	// NewFilter already holds the native arch; the sub-arches (x86 and x32
	// on amd64) let a sandbox run 32-bit binaries under their own syscall
	// table instead of having them killed for a bad arch.
	for _, a := range s.Architectures {
		sa, err := libseccomp.GetArchFromString(strings.TrimPrefix(string(a), "SCMP_ARCH_"))
		if err != nil {
			return nil, nil, errdefs.Invalid("seccomp.architectures", "%v", err)
		}
		if err := filter.AddArch(sa); err != nil {
			return nil, nil, fmt.Errorf("adding seccomp arch %s: %w", a, err)
		}
	}
	// The caller of Load sets no_new_privs itself; libseccomp's NNP
	// attribute only matters to its own loader, but keep it as runc does.
	if err := filter.SetNoNewPrivsBit(false); err != nil {
		return nil, nil, fmt.Errorf("clearing seccomp nnp attribute: %w", err)
	}
	// A call of an arch the filter does not name (x32 in Profile's) is
	// refused as a kernel without that ABI refuses it, not by killing the
	// thread: a program that probes for an ABI carries on.
	if err := filter.SetBadArchAction(libseccomp.ActErrno.SetReturnCode(int16(unix.ENOSYS))); err != nil {
		return nil, nil, fmt.Errorf("setting seccomp bad-arch action: %w", err)
	}
	// runc's choice: a binary tree over syscall numbers for long rule sets
	// (libseccomp <= 2.5.4 misbehaves with it on an empty one). Older
	// libseccomp without the attribute just emits a linear program.
	if len(s.Syscalls) > 32 {
		_ = filter.SetOptimize(2)
	}

	seen := make(map[string]bool)
	for i := range s.Syscalls {
		sk, err := addRules(filter, &s.Syscalls[i], defAct)
		if err != nil {
			return nil, nil, err
		}
		for _, name := range sk {
			if !seen[name] {
				seen[name] = true
				skipped = append(skipped, name)
			}
		}
	}

	prog, err = exportBPF(filter)
	if err != nil {
		return nil, nil, err
	}
	if n := len(prog) / sockFilterSize; len(prog)%sockFilterSize != 0 || n == 0 || n > unix.BPF_MAXINSNS {
		return nil, nil, fmt.Errorf("compiling seccomp filter: %d bytes is not a loadable program (max %d instructions)", len(prog), unix.BPF_MAXINSNS)
	}
	return prog, skipped, nil
}

// addRules adds one profile entry: a rule per name, with the entry's
// argument conditions ANDed, except that conditions repeating an argument
// index become separate rules (ORed), which is what runc does and what
// Docker's profile is written against.
func addRules(filter *libseccomp.ScmpFilter, sc *specs.LinuxSyscall, defAct libseccomp.ScmpAction) (skipped []string, err error) {
	act, err := action(sc.Action, sc.ErrnoRet)
	if err != nil {
		return nil, errdefs.Invalid("seccomp.syscalls", "%v: %v", sc.Names, err)
	}
	if act == defAct {
		// libseccomp refuses a rule that repeats the default action.
		return nil, nil
	}
	conds := make([]libseccomp.ScmpCondition, 0, len(sc.Args))
	var perIndex [6]int
	repeated := false
	for _, a := range sc.Args {
		op, err := operator(a.Op)
		if err != nil {
			return nil, errdefs.Invalid("seccomp.syscalls", "%v: %v", sc.Names, err)
		}
		c, err := libseccomp.MakeCondition(a.Index, op, a.Value, a.ValueTwo)
		if err != nil {
			return nil, errdefs.Invalid("seccomp.syscalls", "%v: %v", sc.Names, err)
		}
		perIndex[a.Index]++
		repeated = repeated || perIndex[a.Index] > 1
		conds = append(conds, c)
	}
	for _, name := range sc.Names {
		if name == "" {
			return nil, errdefs.Invalid("seccomp.syscalls", "empty syscall name")
		}
		nr, err := libseccomp.GetSyscallFromName(name)
		if err != nil {
			// Newer than this libseccomp (or another arch's): runc skips
			// these too, so the default action applies.
			skipped = append(skipped, name)
			continue
		}
		switch {
		case len(conds) == 0:
			err = filter.AddRule(nr, act)
		case repeated:
			for _, c := range conds {
				if err = filter.AddRuleConditional(nr, act, []libseccomp.ScmpCondition{c}); err != nil {
					break
				}
			}
		default:
			err = filter.AddRuleConditional(nr, act, conds)
		}
		if err != nil {
			return nil, fmt.Errorf("adding seccomp rule for %s: %w", name, err)
		}
	}
	return skipped, nil
}

// action maps a spec action to libseccomp's, as runc does: KILL kills the
// thread, ERRNO and TRACE default to EPERM when no errno is given.
func action(a specs.LinuxSeccompAction, errnoRet *uint) (libseccomp.ScmpAction, error) {
	ret := int16(unix.EPERM)
	if errnoRet != nil {
		if *errnoRet > 0xffff {
			return libseccomp.ActInvalid, fmt.Errorf("errnoRet %d out of range", *errnoRet)
		}
		ret = int16(*errnoRet)
	}
	switch a {
	case specs.ActKill, specs.ActKillThread:
		return libseccomp.ActKillThread, nil
	case specs.ActKillProcess:
		return libseccomp.ActKillProcess, nil
	case specs.ActTrap:
		return libseccomp.ActTrap, nil
	case specs.ActErrno:
		return libseccomp.ActErrno.SetReturnCode(ret), nil
	case specs.ActTrace:
		return libseccomp.ActTrace.SetReturnCode(ret), nil
	case specs.ActAllow:
		return libseccomp.ActAllow, nil
	case specs.ActLog:
		return libseccomp.ActLog, nil
	}
	return libseccomp.ActInvalid, fmt.Errorf("action %q is not supported", a)
}

func operator(op specs.LinuxSeccompOperator) (libseccomp.ScmpCompareOp, error) {
	switch op {
	case specs.OpNotEqual:
		return libseccomp.CompareNotEqual, nil
	case specs.OpLessThan:
		return libseccomp.CompareLess, nil
	case specs.OpLessEqual:
		return libseccomp.CompareLessOrEqual, nil
	case specs.OpEqualTo:
		return libseccomp.CompareEqual, nil
	case specs.OpGreaterEqual:
		return libseccomp.CompareGreaterEqual, nil
	case specs.OpGreaterThan:
		return libseccomp.CompareGreater, nil
	case specs.OpMaskedEqual:
		return libseccomp.CompareMaskedEqual, nil
	}
	return libseccomp.CompareInvalid, fmt.Errorf("operator %q is not supported", op)
}

// exportBPF returns the filter's program. libseccomp >= 2.6 exports to
// memory; older ones (Debian 12 has 2.5.4) only write to an fd, so a memfd
// stands in.
func exportBPF(filter *libseccomp.ScmpFilter) ([]byte, error) {
	prog, err := filter.ExportBPFMem()
	if err == nil {
		return prog, nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return nil, fmt.Errorf("exporting seccomp filter: %w", err)
	}
	fd, err := unix.MemfdCreate("paddock-seccomp", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("exporting seccomp filter: %w", err)
	}
	f := os.NewFile(uintptr(fd), "paddock-seccomp")
	defer f.Close()
	if err := filter.ExportBPF(f); err != nil {
		return nil, fmt.Errorf("exporting seccomp filter: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("exporting seccomp filter: %w", err)
	}
	prog, err = io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("exporting seccomp filter: %w", err)
	}
	return prog, nil
}
