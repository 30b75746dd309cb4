package seccomp

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// A sandbox's filter in two parts. The kernel converts and compiles a
// filter's whole program for each process that loads it (the default
// profile's 925 instructions cost a guest about 0.3 ms of CPU, 2.5% of a
// churn cycle's: issue 21), but a filter a process inherits across fork
// costs nothing. So the forker loads a base filter once and every guest
// inherits it; the guest, its set-up done, loads a short tail. Stacked,
// the kernel runs both and takes the stricter answer (the newer filter's
// on a tie), so
//
//   - Base is Docker's profile for the sandbox's caps plus SetupCaps, and
//     SetupCalls allowed: the set-up a guest does before its sandbox runs
//     (mounts, pivot_root, namespaces) passes it, and the forker itself
//     runs under it.
//   - Tail returns ALLOW for every call but those whose rules SetupCaps
//     change (Split.Calls: mount, unshare, setns, clone, ...), which get
//     the sandbox's own rules: a libseccomp program for those calls alone,
//     behind a prologue that sends only them to it.
//
// Base and Tail together give every call, whatever its arguments and
// arch, what the sandbox's profile alone gives it: each call either is
// outside Calls, where Base has the sandbox's rules and Tail allows, or in
// it, where Tail has them and Base is at least as permissive
// (TestSplitMatchesProfile checks both, call by call, on an interpreter
// of the programs, and in the kernel).

// SetupCaps are the capabilities whose rules a guest's set-up needs, and
// SetupCalls the calls it needs that the profile refuses whatever the
// caps (pivot_root): the base allows them, the tail applies the
// sandbox's rules.
var (
	SetupCaps  = []string{"CAP_SYS_ADMIN"}
	SetupCalls = []string{"pivot_root"}
)

// Split is a sandbox's filter as a base and a tail (see above).
type Split struct {
	Base, Tail []byte
	// Calls are the calls the tail decides, sorted.
	Calls []string
}

// auditArch is the kernel's number for each arch a profile may name
// (seccomp_data.arch); a profile naming another cannot be split.
var auditArch = map[specs.Arch]uint32{
	specs.ArchX86_64:  unix.AUDIT_ARCH_X86_64,
	specs.ArchX86:     unix.AUDIT_ARCH_I386,
	specs.ArchAARCH64: unix.AUDIT_ARCH_AARCH64,
	specs.ArchARM:     unix.AUDIT_ARCH_ARM,
}

// CompileSplit compiles the filter of a sandbox holding caps as a Split.
// It fails where the profile cannot be split (an arch without a known
// number, a tail too long); the caller then loads Compile's program in
// each guest.
func CompileSplit(caps []string) (Split, error) {
	sandbox, err := Profile(caps)
	if err != nil {
		return Split{}, err
	}
	wider := slices.Clone(caps)
	for _, c := range SetupCaps {
		if !slices.Contains(wider, c) {
			wider = append(wider, c)
		}
	}
	base, err := Profile(wider)
	if err != nil {
		return Split{}, err
	}
	base.Syscalls = append(base.Syscalls, specs.LinuxSyscall{Names: SetupCalls, Action: specs.ActAllow})
	calls := differing(sandbox, base)
	baseProg, _, err := CompileSpec(base)
	if err != nil {
		return Split{}, err
	}
	only := *sandbox
	only.Syscalls = nil
	for _, sc := range sandbox.Syscalls {
		names := slices.DeleteFunc(slices.Clone(sc.Names), func(n string) bool { return !slices.Contains(calls, n) })
		if len(names) > 0 {
			sc.Names = names
			only.Syscalls = append(only.Syscalls, sc)
		}
	}
	body, _, err := CompileSpec(&only)
	if err != nil {
		return Split{}, err
	}
	pro, err := prologue(sandbox.Architectures, calls)
	if err != nil {
		return Split{}, err
	}
	tail := append(pro, body...)
	if n := len(tail) / sockFilterSize; n > unix.BPF_MAXINSNS {
		return Split{}, fmt.Errorf("splitting seccomp filter: a tail of %d instructions", n)
	}
	return Split{Base: baseProg, Tail: tail, Calls: calls}, nil
}

// differing returns the sorted names whose rules differ between profiles a
// and b: a rule is an entry's action, errno and argument conditions, and a
// name's rules are those of the entries that list it, in order.
func differing(a, b *specs.LinuxSeccomp) []string {
	rules := func(p *specs.LinuxSeccomp) map[string]string {
		m := make(map[string]string)
		for _, sc := range p.Syscalls {
			r, _ := json.Marshal(struct {
				A specs.LinuxSeccompAction
				E *uint
				C []specs.LinuxSeccompArg
			}{sc.Action, sc.ErrnoRet, sc.Args})
			for _, n := range sc.Names {
				m[n] += string(r) + ";"
			}
		}
		return m
	}
	ra, rb := rules(a), rules(b)
	var out []string
	for n, r := range ra {
		if rb[n] != r {
			out = append(out, n)
		}
	}
	for n := range rb {
		if _, ok := ra[n]; !ok {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Classic BPF, as seccomp runs it (linux/filter.h, linux/seccomp.h).
const (
	bpfLdWAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJgeK   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	bpfRetK   = unix.BPF_RET | unix.BPF_K

	dataNr   = 0 // offsetof(struct seccomp_data, nr)
	dataArch = 4 // offsetof(struct seccomp_data, arch)

	retAllow = unix.SECCOMP_RET_ALLOW
)

type insn struct {
	code   uint16
	jt, jf uint8
	k      uint32
}

// prologue is the tail's start: for each arch in archs, a call whose
// number is one of calls' on that arch jumps past it (to the program that
// follows, which decides); every other call is allowed, as is every call
// of an arch not in archs (the base decides those: it refuses them).
//
// Each arch's numbers are searched as a binary tree, not one by one: the
// kernel runs the tail once for every call number of each arch as it
// loads it, to find the calls it always allows (the filter's cache), and
// a linear scan of two dozen numbers cost that more than the tail saves.
func prologue(archs []specs.Arch, calls []string) ([]byte, error) {
	var prog []insn
	prog = append(prog, insn{code: bpfLdWAbs, k: dataArch})
	var toBody []int // jumps whose jt goes to the body, after the prologue
	// The native arch's calls must reach the body: a profile that does
	// not name it (libseccomp adds it to any filter) is not split.
	native, err := libseccomp.GetNativeArch()
	if err != nil {
		return nil, fmt.Errorf("splitting seccomp filter: %w", err)
	}
	named := false
	for _, a := range archs {
		audit, ok := auditArch[a]
		if !ok {
			return nil, fmt.Errorf("splitting seccomp filter: no number for arch %s", a)
		}
		sa, err := libseccomp.GetArchFromString(strings.TrimPrefix(string(a), "SCMP_ARCH_"))
		if err != nil {
			return nil, fmt.Errorf("splitting seccomp filter: %w", err)
		}
		named = named || sa == native
		var nrs []uint32
		for _, name := range calls {
			nr, err := libseccomp.GetSyscallFromNameByArch(name, sa)
			if err != nil || nr < 0 {
				continue // not a call on this arch (or unknown to libseccomp: CompileSpec skips it too)
			}
			nrs = append(nrs, uint32(nr))
		}
		slices.Sort(nrs)
		nrs = slices.Compact(nrs)
		var block []insn
		block = append(block, insn{code: bpfLdWAbs, k: dataNr})
		block = search(block, nrs, &toBody, len(prog)+1)
		if len(block) > 255 {
			return nil, fmt.Errorf("splitting seccomp filter: %d calls on arch %s", len(nrs), a)
		}
		prog = append(prog, insn{code: bpfJeqK, k: audit, jf: uint8(len(block))})
		prog = append(prog, block...)
	}
	if !named {
		return nil, fmt.Errorf("splitting seccomp filter: the profile does not name this host's arch %s", native)
	}
	prog = append(prog, insn{code: bpfRetK, k: retAllow})
	for _, pc := range toBody {
		off := len(prog) - pc - 1
		if off > 255 {
			return nil, fmt.Errorf("splitting seccomp filter: a prologue of %d instructions", len(prog))
		}
		prog[pc].jt = uint8(off)
	}
	out := make([]byte, 0, len(prog)*sockFilterSize)
	for _, in := range prog {
		out = binary.NativeEndian.AppendUint16(out, in.code)
		out = append(out, in.jt, in.jf)
		out = binary.NativeEndian.AppendUint32(out, in.k)
	}
	return out, nil
}

// search appends to block the test of the call number (in the
// accumulator) against the sorted nrs: equal to one, a jump whose pc
// (block's index plus base) is added to toBody; none, ret ALLOW. Above a
// few numbers it splits them at the middle (jge), the lower half first.
func search(block []insn, nrs []uint32, toBody *[]int, base int) []insn {
	if len(nrs) <= 3 {
		for _, nr := range nrs {
			*toBody = append(*toBody, base+len(block))
			block = append(block, insn{code: bpfJeqK, k: nr})
		}
		return append(block, insn{code: bpfRetK, k: retAllow})
	}
	mid := len(nrs) / 2
	at := len(block)
	block = append(block, insn{code: bpfJgeK, k: nrs[mid]})
	block = search(block, nrs[:mid], toBody, base)
	// jt skips the lower half; the tree is small enough for 8 bits
	// (prologue checks the whole block).
	block[at].jt = uint8(min(len(block)-at-1, 255))
	return search(block, nrs[mid:], toBody, base)
}
