package seccomp

import (
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// interpret runs prog, a classic BPF program as seccomp runs it, on
// data (a struct seccomp_data), and returns its answer. It knows the
// instructions libseccomp and prologue emit and fails the test on any
// other.
func interpret(t testing.TB, prog []byte, data []byte) uint32 {
	var a, x uint32
	var mem [16]uint32
	n := len(prog) / sockFilterSize
	for pc := 0; pc < n; pc++ {
		in := prog[pc*sockFilterSize:]
		code := binary.NativeEndian.Uint16(in)
		jt, jf := int(in[2]), int(in[3])
		k := binary.NativeEndian.Uint32(in[4:])
		// A conditional jump compares the accumulator with k or, for
		// BPF_X, with x.
		if code&0x07 == unix.BPF_JMP && code&0xf0 != unix.BPF_JA {
			src := k
			if code&unix.BPF_X != 0 {
				src = x
			}
			var cond bool
			switch code &^ unix.BPF_X {
			case unix.BPF_JMP | unix.BPF_JEQ:
				cond = a == src
			case unix.BPF_JMP | unix.BPF_JGT:
				cond = a > src
			case unix.BPF_JMP | unix.BPF_JGE:
				cond = a >= src
			case unix.BPF_JMP | unix.BPF_JSET:
				cond = a&src != 0
			default:
				t.Fatalf("pc %d: instruction %#x not interpreted", pc, code)
			}
			if cond {
				pc += jt
			} else {
				pc += jf
			}
			continue
		}
		switch code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if k%4 != 0 || int(k)+4 > len(data) {
				t.Fatalf("pc %d: load at %d", pc, k)
			}
			a = binary.NativeEndian.Uint32(data[k:])
		case unix.BPF_LD | unix.BPF_IMM:
			a = k
		case unix.BPF_LDX | unix.BPF_IMM:
			x = k
		case unix.BPF_LD | unix.BPF_MEM:
			a = mem[k]
		case unix.BPF_LDX | unix.BPF_MEM:
			x = mem[k]
		case unix.BPF_ST:
			mem[k] = a
		case unix.BPF_STX:
			mem[k] = x
		case unix.BPF_MISC | unix.BPF_TAX:
			x = a
		case unix.BPF_MISC | unix.BPF_TXA:
			a = x
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			a &= k
		case unix.BPF_ALU | unix.BPF_OR | unix.BPF_K:
			a |= k
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_X:
			a &= x
		case unix.BPF_JMP | unix.BPF_JA:
			pc += int(k)
		case unix.BPF_RET | unix.BPF_K:
			return k
		case unix.BPF_RET | unix.BPF_A:
			return a
		default:
			t.Fatalf("pc %d: instruction %#x not interpreted", pc, code)
		}
	}
	t.Fatal("the program ran off its end")
	return 0
}

// stacked is the kernel's answer for filters that answered rets, the
// newest first (kernel/seccomp.c, seccomp_run_filters): the lowest action,
// as a signed number, wins; on a tie the newer filter's answer.
func stacked(rets ...uint32) uint32 {
	ret := uint32(unix.SECCOMP_RET_ALLOW)
	for _, r := range rets {
		if int32(r&unix.SECCOMP_RET_ACTION_FULL) < int32(ret&unix.SECCOMP_RET_ACTION_FULL) {
			ret = r
		}
	}
	return ret
}

// seccompData lays out a struct seccomp_data.
func seccompData(nr, arch uint32, args [6]uint64) []byte {
	b := make([]byte, 0, 64)
	b = binary.NativeEndian.AppendUint32(b, nr)
	b = binary.NativeEndian.AppendUint32(b, arch)
	b = binary.NativeEndian.AppendUint64(b, 0) // instruction pointer
	for _, v := range args {
		b = binary.NativeEndian.AppendUint64(b, v)
	}
	return b
}

// argSets are the arguments each call is tried with: none, all bits, each
// namespace flag in each of the first three arguments (clone, unshare,
// setns), the personalities and socket families the profile names, and
// random ones.
func argSets() [][6]uint64 {
	sets := [][6]uint64{{}, {^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}}
	ns := []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC,
		unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWTIME,
		unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD}
	for i := range 3 {
		for _, f := range ns {
			var s [6]uint64
			s[i] = f
			sets = append(sets, s)
		}
	}
	for _, v := range []uint64{0x0008, 0x20000, 0x20008, 0x0400000, 0xffffffff} {
		sets = append(sets, [6]uint64{v})
	}
	for fam := range uint64(46) {
		sets = append(sets, [6]uint64{fam, unix.SOCK_STREAM}, [6]uint64{fam, unix.SOCK_RAW})
	}
	r := rand.New(rand.NewPCG(21, 2026))
	for range 16 {
		var s [6]uint64
		for i := range s {
			s[i] = r.Uint64()
			if r.IntN(2) == 0 {
				s[i] &= 0xffffffff
			}
		}
		sets = append(sets, s)
	}
	return sets
}

// TestSplitMatchesProfile: for every call number of every arch the
// profile names (and of x32, and of an arch it does not), with each of
// argSets, the base and the tail stacked answer exactly what the whole
// profile's program answers; and the tail sends to its rules only the
// calls it decides, allowing the rest.
func TestSplitMatchesProfile(t *testing.T) {
	onAMD64(t)
	caps := []([]string){SandboxCaps, DockerDefaultCaps}
	for _, c := range caps {
		full := compile(t, c)
		s, err := CompileSplit(c)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(s.Calls, "mount") || !slices.Contains(s.Calls, "pivot_root") || slices.Contains(s.Calls, "read") {
			t.Fatalf("the tail decides %v", s.Calls)
		}
		// The interpreter against what the profile is known to say, and
		// the base alone, which must not be enough.
		errno := func(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }
		for _, k := range []struct {
			nr, arch uint32
			want     uint32
		}{
			{unix.SYS_READ, unix.AUDIT_ARCH_X86_64, unix.SECCOMP_RET_ALLOW},
			{unix.SYS_MOUNT, unix.AUDIT_ARCH_X86_64, errno(unix.EPERM)},
			{unix.SYS_CLONE3, unix.AUDIT_ARCH_X86_64, errno(unix.ENOSYS)},
			{unix.SYS_READ | 0x40000000, unix.AUDIT_ARCH_X86_64, errno(unix.ENOSYS)},
			{21, unix.AUDIT_ARCH_I386, errno(unix.EPERM)}, // i386's mount
		} {
			d := seccompData(k.nr, k.arch, [6]uint64{})
			if got := interpret(t, full, d); got != k.want {
				t.Fatalf("the profile answers call %#x of arch %#x with %#x, want %#x", k.nr, k.arch, got, k.want)
			}
		}
		for _, nr := range []uint32{unix.SYS_MOUNT, unix.SYS_PIVOT_ROOT, unix.SYS_SETNS} {
			if got := interpret(t, s.Base, seccompData(nr, unix.AUDIT_ARCH_X86_64, [6]uint64{})); got != unix.SECCOMP_RET_ALLOW {
				t.Fatalf("the base answers call %d with %#x, want ALLOW", nr, got)
			}
		}
		decided := map[uint32]map[uint32]bool{}
		for _, arch := range []uint32{unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_I386} {
			decided[arch] = map[uint32]bool{}
			sa := map[uint32]libseccomp.ScmpArch{unix.AUDIT_ARCH_X86_64: libseccomp.ArchAMD64, unix.AUDIT_ARCH_I386: libseccomp.ArchX86}[arch]
			for _, name := range s.Calls {
				if nr, ok := syscallNumber(name, sa); ok {
					decided[arch][nr] = true
				}
			}
		}
		var nrs []uint32
		for nr := range uint32(1024) {
			nrs = append(nrs, nr, nr|0x40000000) // and with x32's bit
		}
		nrs = append(nrs, 0xffffffff)
		sets := argSets()
		checked := 0
		for _, arch := range []uint32{unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_AARCH64, 0} {
			for _, nr := range nrs {
				for _, args := range sets {
					d := seccompData(nr, arch, args)
					want := interpret(t, full, d)
					tail := interpret(t, s.Tail, d)
					got := stacked(tail, interpret(t, s.Base, d))
					if got != want {
						t.Fatalf("caps %v: arch %#x call %d args %#x: split answers %#x, the profile %#x", c, arch, nr, args, got, want)
					}
					if !decided[arch][nr] && tail != unix.SECCOMP_RET_ALLOW {
						t.Fatalf("caps %v: arch %#x call %d: the tail answers %#x for a call it does not decide", c, arch, nr, tail)
					}
					checked++
				}
			}
		}
		t.Logf("caps %d: %d calls decided by the tail, base %d instructions, tail %d, the profile %d; %d cases agree",
			len(c), len(s.Calls), len(s.Base)/sockFilterSize, len(s.Tail)/sockFilterSize, len(full)/sockFilterSize, checked)
	}
}

// syscallNumber is name's number on arch, from libseccomp as the
// prologue has it.
func syscallNumber(name string, arch libseccomp.ScmpArch) (uint32, bool) {
	nr, err := libseccomp.GetSyscallFromNameByArch(name, arch)
	if err != nil || nr < 0 {
		return 0, false
	}
	return uint32(nr), true
}

// TestSplitInKernel runs probes under the base and the tail loaded one
// after the other, as a guest ends up, and under the whole profile: each
// gets the same answer from both.
func TestSplitInKernel(t *testing.T) {
	s, err := CompileSplit(SandboxCaps)
	if err != nil {
		t.Fatal(err)
	}
	full := compile(t, SandboxCaps)
	for _, name := range []string{"unshare-newuser-newns", "clone-newns", "clone3", "setns", "mount", "pivot_root", "keyctl",
		"bpf", "perf_event_open", "personality-readexec", "socket-vsock", "ptrace-pid1", "personality-linux32",
		"socket-inet", "socket-netlink", "chroot", "read-file", "fork-exec-true", "threads"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			want := probe(t, full, name)[0]
			if got := probeUnder(t, [][]byte{s.Base, s.Tail}, name)[0]; got != want {
				t.Fatalf("under base and tail: %s, under the profile: %s", errnoName(got), errnoName(want))
			}
		})
	}
}

// TestPrologueRefuses: a profile that does not name this host's arch, or
// names one without a known number, is not split (its guests load it
// whole), since the tail would allow every call of that arch.
func TestPrologueRefuses(t *testing.T) {
	onAMD64(t)
	for _, archs := range [][]specs.Arch{{specs.ArchX86}, {specs.ArchX86_64, specs.ArchMIPS}} {
		if _, err := prologue(archs, []string{"mount"}); err == nil {
			t.Errorf("a prologue for %v", archs)
		}
	}
	if _, err := prologue([]specs.Arch{specs.ArchX86_64, specs.ArchX86}, []string{"mount"}); err != nil {
		t.Fatal(err)
	}
}

// onAMD64 skips a test written against x86-64's and i386's call numbers.
func onAMD64(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("written for x86-64's call numbers")
	}
}
