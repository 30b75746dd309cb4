package seccomp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// A seccomp filter cannot be removed, so every test that loads one does it in
// a child: the test binary re-executes itself with envChild set. The "load"
// child locks its thread, sets no_new_privs, calls Load and execs its
// arguments (usually the test binary again, as a "probe"), so the exec'd
// image runs wholly under the filter, the way a sandbox's PID 1 does.
const (
	envChild  = "PADDOCK_SECCOMP_TEST_CHILD"  // load, probe, bench-load, bench-syscall
	envProg   = "PADDOCK_SECCOMP_TEST_PROG"   // load: file holding the program
	envThen   = "PADDOCK_SECCOMP_TEST_THEN"   // load: envChild for the exec'd image
	envReport = "PADDOCK_SECCOMP_TEST_REPORT" // load: print each thread's seccomp mode first
	envNoNNP  = "PADDOCK_SECCOMP_TEST_NO_NNP" // load: skip no_new_privs, drop CAP_SYS_ADMIN
	envCount  = "PADDOCK_SECCOMP_TEST_COUNT"  // bench-*: iterations
	envAll    = "PADDOCK_SECCOMP_TEST_ALL"    // load: LoadAllThreads instead of Load
)

func TestMain(m *testing.M) {
	switch c := os.Getenv(envChild); c {
	case "":
		os.Exit(m.Run())
	case "load":
		childLoad(os.Args[1:])
	case "probe":
		childProbe(os.Args[1], os.Args[2:])
	case "bench-load":
		childBenchLoad()
	case "bench-syscall":
		childBenchSyscall()
	default:
		childFail(fmt.Errorf("unknown %s=%q", envChild, c))
	}
	os.Exit(0)
}

func childFail(err error) {
	fmt.Fprintln(os.Stderr, "child:", err)
	os.Exit(2)
}

// childLoad is what paddock guest does before its steady state: lock the
// thread, no_new_privs, Load, execve.
func childLoad(argv []string) {
	runtime.LockOSThread()
	progs := childProgs()
	prog := progs[0]
	if os.Getenv(envNoNNP) != "" {
		if err := dropEffectiveCap(unix.CAP_SYS_ADMIN); err != nil {
			childFail(err)
		}
		err := Load(prog)
		fmt.Printf("load=%v denied=%v\n", err, errors.Is(err, errdefs.ErrDenied))
		os.Exit(0)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		childFail(err)
	}
	load := Load
	if os.Getenv(envAll) != "" {
		load = LoadAllThreads
	}
	for _, prog := range progs {
		if err := load(prog); err != nil {
			childFail(err)
		}
	}
	if os.Getenv(envReport) != "" {
		reportThreads()
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, envChild+"=") })
	if then := os.Getenv(envThen); then != "" {
		env = append(env, envChild+"="+then)
	}
	childFail(unix.Exec(argv[0], argv, env))
}

// childProgs reads the programs envProg names: one, or several (a split
// filter's base, then its tail).
func childProgs() [][]byte {
	var progs [][]byte
	for _, path := range filepath.SplitList(os.Getenv(envProg)) {
		prog, err := os.ReadFile(path)
		if err != nil {
			childFail(err)
		}
		progs = append(progs, prog)
	}
	return progs
}

// dropEffectiveCap clears one capability from the calling thread's effective
// set (capabilities are per thread, like the filter).
func dropEffectiveCap(c int) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[c/32].Effective &^= 1 << (c % 32)
	return unix.Capset(&hdr, &data[0])
}

// reportThreads prints the seccomp mode of every thread of the process.
func reportThreads() {
	self := unix.Gettid()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		childFail(err)
	}
	for _, task := range tasks {
		status, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "status"))
		if err != nil {
			continue // the thread exited
		}
		mode := statusField(string(status), "Seccomp")
		if os.Getenv(envAll) != "" {
			mode += " nnp=" + statusField(string(status), "NoNewPrivs")
		}
		fmt.Printf("thread self=%v seccomp=%s\n", task.Name() == strconv.Itoa(self), mode)
	}
}

func statusField(status, key string) string {
	for line := range strings.Lines(status) {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func rawErr(_, _ uintptr, errno unix.Errno) error {
	if errno != 0 {
		return errno
	}
	return nil
}

func socketProbe(domain, typ, proto int) func() error {
	return func() error {
		fd, err := unix.Socket(domain, typ, proto)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
}

// probes attempt one operation each. Arguments are chosen so that, should
// the filter let a denied call through, the kernel fails it harmlessly with a
// different errno (the unfiltered control run checks that).
var probes = map[string]func() error{
	// Go is multithreaded, so the kernel says EINVAL to unshare(CLONE_NEWUSER).
	"unshare-newuser-newns": func() error { return unix.Unshare(unix.CLONE_NEWUSER | unix.CLONE_NEWNS) },
	// CLONE_NEWNS with CLONE_FS is EINVAL in the kernel; no child is made.
	"clone-newns": func() error {
		pid, _, errno := unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_NEWNS|unix.CLONE_NEWUSER|unix.CLONE_FS, 0, 0, 0, 0, 0)
		if errno == 0 && pid == 0 {
			unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
		}
		return rawErr(0, 0, errno)
	},
	"clone3": func() error { return rawErr(unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)) },
	"setns":  func() error { return unix.Setns(-1, unix.CLONE_NEWNS) },
	"mount": func() error {
		return unix.Mount("none", "/nonexistent/paddock-seccomp-test", "tmpfs", 0, "")
	},
	"pivot_root": func() error {
		return unix.PivotRoot("/nonexistent/paddock-seccomp-test", "/nonexistent/paddock-seccomp-test")
	},
	"keyctl": func() error { return rawErr(unix.RawSyscall(unix.SYS_KEYCTL, 0xffff, 0, 0)) },
	"bpf":    func() error { return rawErr(unix.RawSyscall(unix.SYS_BPF, 0xffff, 0, 0)) },
	"perf_event_open": func() error {
		return rawErr(unix.RawSyscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0, 0))
	},
	"init_module":       func() error { return rawErr(unix.RawSyscall(unix.SYS_INIT_MODULE, 0, 0, 0)) },
	"finit_module":      func() error { return rawErr(unix.RawSyscall(unix.SYS_FINIT_MODULE, ^uintptr(0), 0, 0)) },
	"kexec_load":        func() error { return rawErr(unix.RawSyscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0xdead8000, 0, 0)) },
	"open_by_handle_at": func() error { return rawErr(unix.RawSyscall(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0)) },
	// We do not trace pid 1, so the kernel answers ESRCH once the filter
	// lets ptrace through; nothing attaches.
	"ptrace-pid1":          func() error { return rawErr(unix.RawSyscall6(unix.SYS_PTRACE, unix.PTRACE_PEEKUSR, 1, 0, 0, 0, 0)) },
	"personality-query":    func() error { return rawErr(unix.RawSyscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)) },
	"personality-linux32":  func() error { return rawErr(unix.RawSyscall(unix.SYS_PERSONALITY, 0x0008, 0, 0)) },
	"personality-readexec": func() error { return rawErr(unix.RawSyscall(unix.SYS_PERSONALITY, 0x0400000, 0, 0)) },
	"socket-vsock":         socketProbe(unix.AF_VSOCK, unix.SOCK_STREAM, 0),
	"socket-alg":           socketProbe(unix.AF_ALG, unix.SOCK_SEQPACKET, 0),
	"socket-inet":          socketProbe(unix.AF_INET, unix.SOCK_STREAM, 0),
	"socket-inet-udp":      socketProbe(unix.AF_INET, unix.SOCK_DGRAM, 0),
	"socket-unix":          socketProbe(unix.AF_UNIX, unix.SOCK_STREAM, 0),
	"socket-netlink":       socketProbe(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE),
	// CAP_SYS_CHROOT is in Docker's set, so chroot reaches the kernel.
	"chroot": func() error { return unix.Chroot("/nonexistent/paddock-seccomp-test") },
	"read-file": func() error {
		_, err := os.ReadFile("/etc/passwd")
		return err
	},
	"fork-exec-true": func() error { return exec.Command("/bin/true").Run() },
	// More goroutines pinned by LockOSThread than there are threads force
	// the runtime to clone new ones.
	"threads": func() error {
		before := threadCount()
		n := before + 2
		var started, done sync.WaitGroup
		release := make(chan struct{})
		for range n {
			started.Add(1)
			done.Go(func() {
				runtime.LockOSThread()
				started.Done()
				<-release
			})
		}
		started.Wait()
		after := threadCount()
		close(release)
		done.Wait()
		if after <= before {
			return fmt.Errorf("threads: %d before, %d with %d locked goroutines", before, after, n)
		}
		return nil
	},
}

func threadCount() int {
	tasks, _ := os.ReadDir("/proc/self/task")
	return len(tasks)
}

// childProbe runs probe name and prints "errno=N" (0: success). The probe
// "raw" runs each argument "nr,a0,a1,..." as a raw syscall instead.
func childProbe(name string, args []string) {
	var errs []error
	if name == "raw" {
		for _, a := range args {
			var nums [7]uintptr
			for i, f := range strings.Split(a, ",") {
				v, err := strconv.ParseUint(f, 0, 64)
				if err != nil {
					childFail(err)
				}
				nums[i] = uintptr(v)
			}
			errs = append(errs, rawErr(unix.RawSyscall6(nums[0], nums[1], nums[2], nums[3], nums[4], nums[5], nums[6])))
		}
	} else {
		p, ok := probes[name]
		if !ok {
			childFail(fmt.Errorf("no probe %q", name))
		}
		errs = append(errs, p())
	}
	for _, err := range errs {
		var errno unix.Errno
		switch {
		case err == nil:
		case errors.As(err, &errno):
		default:
			childFail(err)
		}
		fmt.Printf("errno=%d\n", int(errno))
	}
}

// childBenchLoad times loading a program envCount times; with several
// programs in envProg, all but the last are loaded once first (a split
// filter's base, which a guest inherits) and the last is the one timed.
func childBenchLoad() {
	runtime.LockOSThread()
	progs := childProgs()
	n, _ := strconv.Atoi(os.Getenv(envCount))
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		childFail(err)
	}
	for _, prog := range progs[:len(progs)-1] {
		if err := Load(prog); err != nil {
			childFail(err)
		}
	}
	timed := progs[len(progs)-1]
	start := time.Now()
	for range n {
		if err := Load(timed); err != nil {
			childFail(err)
		}
	}
	fmt.Printf("ns=%d\n", time.Since(start).Nanoseconds())
}

func childBenchSyscall() {
	n, _ := strconv.Atoi(os.Getenv(envCount))
	start := time.Now()
	for range n {
		unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
	}
	fmt.Printf("ns=%d\n", time.Since(start).Nanoseconds())
}

// self is the test binary, for children to exec.
func self(t testing.TB) string {
	t.Helper()
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func childEnv(kv ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "PADDOCK_SECCOMP_TEST_") })
	return append(env, kv...)
}

// underFilter runs argv in a child that has loaded prog; then names the
// child role of the exec'd image when it is the test binary.
func underFilter(t testing.TB, prog []byte, env []string, then string, argv ...string) string {
	t.Helper()
	return underFilters(t, [][]byte{prog}, env, then, argv...)
}

// underFilters is underFilter with the programs progs loaded one after
// the other.
func underFilters(t testing.TB, progs [][]byte, env []string, then string, argv ...string) string {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for i, prog := range progs {
		path := filepath.Join(dir, fmt.Sprintf("prog%d.bpf", i))
		if err := os.WriteFile(path, prog, 0o600); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	cmd := exec.Command(self(t), argv...)
	cmd.Env = childEnv(append(env, envChild+"=load", envProg+"="+strings.Join(paths, string(os.PathListSeparator)), envThen+"="+then)...)
	return output(t, cmd)
}

func output(t testing.TB, cmd *exec.Cmd) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v\nstdout: %s\nstderr: %s", cmd.Args, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// probe runs a probe under prog, or unfiltered when prog is nil, and returns
// one errno per call it made.
func probe(t testing.TB, prog []byte, name string, args ...string) []unix.Errno {
	t.Helper()
	if prog == nil {
		return probeUnder(t, nil, name, args...)
	}
	return probeUnder(t, [][]byte{prog}, name, args...)
}

// probeUnder is probe under the programs progs, loaded one after the
// other.
func probeUnder(t testing.TB, progs [][]byte, name string, args ...string) []unix.Errno {
	t.Helper()
	argv := append([]string{self(t), name}, args...)
	var out string
	if progs == nil {
		cmd := exec.Command(self(t), argv[1:]...)
		cmd.Env = childEnv(envChild + "=probe")
		out = output(t, cmd)
	} else {
		out = underFilters(t, progs, nil, "probe", argv...)
	}
	var errnos []unix.Errno
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errno="); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("bad probe output %q", out)
			}
			errnos = append(errnos, unix.Errno(n))
		}
	}
	if len(errnos) == 0 {
		t.Fatalf("probe %s printed no result: %q", name, out)
	}
	return errnos
}

func withCaps(extra ...string) []string {
	return append(slices.Clone(DockerDefaultCaps), extra...)
}

var compiled sync.Map // strings.Join(caps) -> []byte

func compile(t testing.TB, caps []string) []byte {
	t.Helper()
	key := strings.Join(caps, ",")
	if p, ok := compiled.Load(key); ok {
		return p.([]byte)
	}
	prog, err := Compile(caps)
	if err != nil {
		t.Fatal(err)
	}
	compiled.Store(key, prog)
	return prog
}

func errnoName(e unix.Errno) string {
	if e == 0 {
		return "success"
	}
	return fmt.Sprintf("%s (%d)", unix.ErrnoName(e), int(e))
}

// TestFilter runs each probe under the compiled default profile. A denied
// call must fail with the profile's errno and, run without the filter, must
// not (so the errno comes from the filter, not the kernel). An allowed call
// must get the kernel's own answer.
func TestFilter(t *testing.T) {
	sysAdmin := withCaps("CAP_SYS_ADMIN")
	tests := []struct {
		probe  string
		caps   []string // nil: DockerDefaultCaps
		want   unix.Errno
		denied bool
	}{
		{probe: "unshare-newuser-newns", want: unix.EPERM, denied: true},
		{probe: "clone-newns", want: unix.EPERM, denied: true},
		// ENOSYS, not EPERM, so glibc falls back to clone(2), whose flags
		// the filter can see.
		{probe: "clone3", want: unix.ENOSYS, denied: true},
		{probe: "setns", want: unix.EPERM, denied: true},
		{probe: "mount", want: unix.EPERM, denied: true},
		{probe: "pivot_root", want: unix.EPERM, denied: true},
		{probe: "keyctl", want: unix.EPERM, denied: true},
		{probe: "bpf", want: unix.EPERM, denied: true},
		{probe: "perf_event_open", want: unix.EPERM, denied: true},
		{probe: "init_module", want: unix.EPERM, denied: true},
		{probe: "finit_module", want: unix.EPERM, denied: true},
		{probe: "kexec_load", want: unix.EPERM, denied: true},
		{probe: "open_by_handle_at", want: unix.EPERM, denied: true},
		{probe: "personality-readexec", want: unix.EPERM, denied: true},
		{probe: "socket-vsock", want: unix.EPERM, denied: true},
		{probe: "socket-alg", want: unix.EPERM, denied: true},

		// The profile allows ptrace on kernels >= 4.8 (seccomp is checked
		// again after a tracer changes the syscall), so the kernel answers.
		{probe: "ptrace-pid1", want: unix.ESRCH},
		{probe: "personality-query"},
		{probe: "personality-linux32"},
		{probe: "socket-inet"},
		{probe: "socket-inet-udp"},
		{probe: "socket-unix"},
		{probe: "socket-netlink"},
		{probe: "chroot", want: unix.ENOENT},
		{probe: "read-file"},
		{probe: "fork-exec-true"},
		{probe: "threads"},

		// CAP_SYS_ADMIN unlocks the namespace and mount rules: the calls
		// reach the kernel, which fails them on the probe's arguments.
		{probe: "mount", caps: sysAdmin, want: unix.ENOENT},
		{probe: "unshare-newuser-newns", caps: sysAdmin, want: unix.EINVAL},
		{probe: "clone-newns", caps: sysAdmin, want: unix.EINVAL},
		{probe: "clone3", caps: sysAdmin, want: unix.EINVAL},
		{probe: "setns", caps: sysAdmin, want: unix.EBADF},
	}
	for _, tt := range tests {
		name := tt.probe
		if tt.caps != nil {
			name += "/CAP_SYS_ADMIN"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			caps := tt.caps
			if caps == nil {
				caps = DockerDefaultCaps
			}
			got := probe(t, compile(t, caps), tt.probe)[0]
			if got != tt.want {
				t.Fatalf("under filter: %s, want %s", errnoName(got), errnoName(tt.want))
			}
			if !tt.denied {
				return
			}
			if ctl := probe(t, nil, tt.probe)[0]; ctl == tt.want {
				t.Logf("without the filter the kernel also says %s here; the filter's part is not proven", errnoName(ctl))
			}
		})
	}
}

// TestFilterX32: with the x32 ABI left out of the profile (TestProfile),
// an x32 call (getpid with the x32 bit) gets ENOSYS, as from a kernel
// without the ABI, rather than the thread killed; a native call goes on.
func TestFilterX32(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("x32 is an amd64 ABI")
	}
	const x32Bit = 0x40000000
	got := probe(t, compile(t, DockerDefaultCaps), "raw", fmt.Sprint(x32Bit|unix.SYS_GETPID), fmt.Sprint(unix.SYS_GETPID))
	if len(got) != 2 || got[0] != unix.ENOSYS || got[1] != 0 {
		t.Fatalf("x32 getpid, getpid under the filter: %v, want [ENOSYS success]", got)
	}
}

// TestFilterShell runs a shell pipeline under the filter: fork, exec, pipes,
// and the filter inherited by every process.
func TestFilterShell(t *testing.T) {
	out := underFilter(t, compile(t, DockerDefaultCaps), nil, "",
		"/bin/sh", "-c", "grep '^Seccomp' /proc/self/status | sort; /bin/true && echo ok")
	if !strings.Contains(out, "Seccomp:\t2") || !strings.Contains(out, "Seccomp_filters:\t1") || !strings.HasSuffix(out, "ok\n") {
		t.Fatalf("shell under filter printed %q", out)
	}
}

// TestFilterPython runs glibc code under the filter: pthread_create tries
// clone3 first (glibc >= 2.34) and must fall back to clone on ENOSYS.
func TestFilterPython(t *testing.T) {
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("no", python)
	}
	const script = `
import ctypes, json, socket, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(*args):
    args = [ctypes.c_long(a) for a in args]
    return 0 if libc.syscall(*args) >= 0 else ctypes.get_errno()
res = {}
t = threading.Thread(target=lambda: res.__setitem__("thread", 0)); t.start(); t.join()
res["subprocess"] = subprocess.run(["/bin/true"]).returncode
res["clone3"] = sc(435, 0, 0)
res["unshare"] = sc(272, 0x10000000 | 0x20000)
res["mount"] = sc(165, 0, 0, 0, 0, 0)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.close()
res["socket_inet"] = 0
print(json.dumps(res))
`
	out := underFilter(t, compile(t, DockerDefaultCaps), nil, "", python, "-c", script)
	var got map[string]int
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	want := map[string]int{
		"thread":      0,
		"subprocess":  0,
		"clone3":      int(unix.ENOSYS),
		"unshare":     int(unix.EPERM),
		"mount":       int(unix.EPERM),
		"socket_inet": 0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("python %s: got %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
}

// TestLoadFiltersCallingThreadOnly checks what Load's comment promises: the
// loading thread is filtered, the process's other threads are not, and the
// exec'd image is.
func TestLoadFiltersCallingThreadOnly(t *testing.T) {
	out := underFilter(t, compile(t, DockerDefaultCaps), []string{envReport + "=1"}, "",
		"/bin/sh", "-c", "grep '^Seccomp:' /proc/self/status")
	var self, others int
	for line := range strings.Lines(out) {
		switch strings.TrimSpace(line) {
		case "thread self=true seccomp=2":
			self++
		case "thread self=false seccomp=0":
			others++
		case "Seccomp:\t2":
		default:
			t.Errorf("unexpected line %q", line)
		}
	}
	if self != 1 || !strings.HasSuffix(out, "Seccomp:\t2\n") {
		t.Fatalf("want the loading thread and the exec'd shell in filter mode:\n%s", out)
	}
	t.Logf("%d other threads left unfiltered before exec", others)
}

// TestLoadAllThreadsFiltersEveryThread checks the guest's use: with TSYNC
// every thread of the process is filtered and gets no_new_privs.
func TestLoadAllThreadsFiltersEveryThread(t *testing.T) {
	out := underFilter(t, compile(t, DockerDefaultCaps), []string{envReport + "=1", envAll + "=1"}, "",
		"/bin/sh", "-c", "grep '^Seccomp:' /proc/self/status")
	threads := 0
	for line := range strings.Lines(out) {
		line = strings.TrimSpace(line)
		switch {
		case line == "Seccomp:\t2":
		case strings.HasPrefix(line, "thread ") && strings.HasSuffix(line, "seccomp=2 nnp=1"):
			threads++
		default:
			t.Errorf("thread not filtered: %q", line)
		}
	}
	if threads < 2 {
		t.Fatalf("want several filtered threads, got %d:\n%s", threads, out)
	}
}

func TestLoadNeedsNoNewPrivs(t *testing.T) {
	out := underFilter(t, compile(t, DockerDefaultCaps), []string{envNoNNP + "=1"}, "", "/bin/true")
	if !strings.Contains(out, "denied=true") {
		t.Fatalf("Load without no_new_privs and CAP_SYS_ADMIN: %q, want ErrDenied", out)
	}
}

func TestLoadRejectsMalformed(t *testing.T) {
	for _, prog := range [][]byte{nil, make([]byte, 7), make([]byte, 9), make([]byte, 8*(unix.BPF_MAXINSNS+1))} {
		if err := Load(prog); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Load(%d bytes) = %v, want ErrInvalid", len(prog), err)
		}
	}
}

func TestCompile(t *testing.T) {
	a, err := Compile(DockerDefaultCaps)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Compile(slices.Clone(DockerDefaultCaps))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("Compile is not deterministic")
	}
	if len(a)%sockFilterSize != 0 || len(a)/sockFilterSize > unix.BPF_MAXINSNS {
		t.Errorf("program is %d bytes", len(a))
	}
	admin, err := Compile(withCaps("CAP_SYS_ADMIN"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, admin) {
		t.Error("CAP_SYS_ADMIN does not change the program")
	}
	t.Logf("default caps: %d instructions; with CAP_SYS_ADMIN: %d", len(a)/sockFilterSize, len(admin)/sockFilterSize)

	p, err := Profile(DockerDefaultCaps)
	if err != nil {
		t.Fatal(err)
	}
	_, skipped, err := CompileSpec(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("names unknown to this libseccomp, left to the default action: %v", skipped)

	if _, err := Compile([]string{"SYS_ADMIN"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Compile with a misspelt cap = %v, want ErrInvalid", err)
	}
}

// specAllows evaluates the expanded profile the way the compiled filter does
// for allow rules: names match, conditions ANDed unless an index repeats.
func specAllows(p *specs.LinuxSeccomp, name string, args ...uint64) bool {
	arg := func(i uint) uint64 {
		if int(i) < len(args) {
			return args[i]
		}
		return 0
	}
	match := func(a specs.LinuxSeccompArg) bool {
		v := arg(a.Index)
		switch a.Op {
		case specs.OpNotEqual:
			return v != a.Value
		case specs.OpLessThan:
			return v < a.Value
		case specs.OpLessEqual:
			return v <= a.Value
		case specs.OpEqualTo:
			return v == a.Value
		case specs.OpGreaterEqual:
			return v >= a.Value
		case specs.OpGreaterThan:
			return v > a.Value
		case specs.OpMaskedEqual:
			// runtime-spec and libseccomp: Value is the mask, ValueTwo the datum.
			return v&a.Value == a.ValueTwo&a.Value
		}
		return false
	}
	for _, sc := range p.Syscalls {
		if sc.Action != specs.ActAllow || !slices.Contains(sc.Names, name) {
			continue
		}
		seen := map[uint]bool{}
		repeated := false
		for _, a := range sc.Args {
			repeated = repeated || seen[a.Index]
			seen[a.Index] = true
		}
		ok := !repeated || len(sc.Args) == 0
		for _, a := range sc.Args {
			if repeated {
				ok = ok || match(a)
			} else {
				ok = ok && match(a)
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// TestProfile checks that the rules the sandbox relies on survive moby's
// expansion for Docker's caps on this host.
func TestProfile(t *testing.T) {
	p, err := Profile(DockerDefaultCaps)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := Profile(withCaps("CAP_SYS_ADMIN"))
	if err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != specs.ActErrno || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != uint(unix.EPERM) {
		t.Errorf("default action %s/%v, want errno EPERM", p.DefaultAction, p.DefaultErrnoRet)
	}
	if runtime.GOARCH == "amd64" {
		want := []specs.Arch{specs.ArchX86_64, specs.ArchX86} // x32 left out: TestFilterX32
		if !slices.Equal(p.Architectures, want) {
			t.Errorf("architectures %v, want %v", p.Architectures, want)
		}
	}
	const threadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID
	clone3ENOSYS := func(p *specs.LinuxSeccomp) bool {
		for _, sc := range p.Syscalls {
			if slices.Contains(sc.Names, "clone3") && sc.Action == specs.ActErrno && sc.ErrnoRet != nil && *sc.ErrnoRet == uint(unix.ENOSYS) {
				return true
			}
		}
		return false
	}
	checks := []struct {
		name string
		got  bool
		want bool
	}{
		{"clone for a thread", specAllows(p, "clone", threadFlags), true},
		{"clone for fork", specAllows(p, "clone", uint64(unix.SIGCHLD)), true},
		{"clone CLONE_NEWUSER", specAllows(p, "clone", unix.CLONE_NEWUSER|uint64(unix.SIGCHLD)), false},
		{"clone CLONE_NEWNET", specAllows(p, "clone", unix.CLONE_NEWNET), false},
		{"clone3 errno ENOSYS", clone3ENOSYS(p), true},
		{"unshare", specAllows(p, "unshare", unix.CLONE_NEWNS), false},
		{"mount", specAllows(p, "mount"), false},
		{"ptrace (kernel >= 4.8)", specAllows(p, "ptrace"), true},
		{"personality 0xffffffff", specAllows(p, "personality", 0xffffffff), true},
		{"personality PER_LINUX32", specAllows(p, "personality", 0x0008), true},
		{"personality READ_IMPLIES_EXEC", specAllows(p, "personality", 0x0400000), false},
		{"socket AF_UNIX", specAllows(p, "socket", unix.AF_UNIX), true},
		{"socket AF_INET6", specAllows(p, "socket", unix.AF_INET6), true},
		{"socket AF_NETLINK", specAllows(p, "socket", unix.AF_NETLINK), true},
		{"socket AF_VSOCK", specAllows(p, "socket", unix.AF_VSOCK), false},
		{"socket AF_ALG", specAllows(p, "socket", unix.AF_ALG), false},
		{"socket AF_UNSPEC", specAllows(p, "socket", unix.AF_UNSPEC), true}, // not creatable: kernel says EAFNOSUPPORT
		{"chroot (CAP_SYS_CHROOT)", specAllows(p, "chroot"), true},
		{"bpf", specAllows(p, "bpf"), false},
		{"keyctl", specAllows(p, "keyctl"), false},
		{"CAP_SYS_ADMIN: mount", specAllows(admin, "mount"), true},
		{"CAP_SYS_ADMIN: clone CLONE_NEWUSER", specAllows(admin, "clone", unix.CLONE_NEWUSER), true},
		{"CAP_SYS_ADMIN: clone3 allowed", specAllows(admin, "clone3") && !clone3ENOSYS(admin), true},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: allowed=%v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestCompileSpecRejects(t *testing.T) {
	eperm := uint(unix.EPERM)
	base := func() *specs.LinuxSeccomp {
		return &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &eperm}
	}
	rule := func(sc specs.LinuxSyscall) *specs.LinuxSeccomp {
		s := base()
		s.Syscalls = []specs.LinuxSyscall{sc}
		return s
	}
	tests := map[string]*specs.LinuxSeccomp{
		"nil": nil,
		"flag log": func() *specs.LinuxSeccomp {
			s := base()
			s.Flags = []specs.LinuxSeccompFlag{specs.LinuxSeccompFlagLog}
			return s
		}(),
		"bad arch":      func() *specs.LinuxSeccomp { s := base(); s.Architectures = []specs.Arch{"SCMP_ARCH_VAX"}; return s }(),
		"bad default":   {DefaultAction: "SCMP_ACT_NOPE"},
		"notify action": rule(specs.LinuxSyscall{Names: []string{"getpid"}, Action: specs.ActNotify}),
		"bad operator":  rule(specs.LinuxSyscall{Names: []string{"getpid"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Op: "SCMP_CMP_ISH"}}}),
		"arg index 6":   rule(specs.LinuxSyscall{Names: []string{"getpid"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 6, Op: specs.OpEqualTo}}}),
		"empty name":    rule(specs.LinuxSyscall{Names: []string{""}, Action: specs.ActAllow}),
	}
	for name, s := range tests {
		t.Run(name, func(t *testing.T) {
			if _, _, err := CompileSpec(s); !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("CompileSpec = %v, want ErrInvalid", err)
			}
		})
	}

	s := rule(specs.LinuxSyscall{Names: []string{"getpid", "paddock_no_such_syscall", "getpid"}, Action: specs.ActAllow})
	s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{Names: []string{"paddock_no_such_syscall"}, Action: specs.ActAllow})
	_, skipped, err := CompileSpec(s)
	if err != nil || !slices.Equal(skipped, []string{"paddock_no_such_syscall"}) {
		t.Fatalf("CompileSpec with an unknown name: skipped %v, err %v", skipped, err)
	}
}

// TestCompileSpecConditions loads small custom filters and checks every
// comparison operator, masked-equal's mask, AND across arguments and OR
// across repeated indexes and entries, against real syscalls: getpgid(pid)
// and getpriority(which, who) fail with EDOM exactly when a rule matches.
func TestCompileSpecConditions(t *testing.T) {
	const base = 0x100000 // arbitrary pids; existing or not, they never yield EDOM
	edom := uint(unix.EDOM)
	arg := func(i uint, op specs.LinuxSeccompOperator, v, v2 uint64) specs.LinuxSeccompArg {
		return specs.LinuxSeccompArg{Index: i, Op: op, Value: v, ValueTwo: v2}
	}
	deny := func(name string, args ...specs.LinuxSeccompArg) specs.LinuxSyscall {
		return specs.LinuxSyscall{Names: []string{name}, Action: specs.ActErrno, ErrnoRet: &edom, Args: args}
	}
	getpgid := func(pid uint64) string { return fmt.Sprintf("%d,%d", unix.SYS_GETPGID, pid) }
	getprio := func(which, who uint64) string { return fmt.Sprintf("%d,%d,%d", unix.SYS_GETPRIORITY, which, who) }
	pgids := []uint64{base - 1, base, base + 1, base + 0x10, base + 0x1f, base + 0x20, 1<<32 | base}
	tests := []struct {
		name  string
		rules []specs.LinuxSyscall
		calls []string
		match []bool
	}{
		{"eq", []specs.LinuxSyscall{deny("getpgid", arg(0, specs.OpEqualTo, base, 0))}, nil, []bool{false, true, false, false, false, false, false}},
		{"ne", []specs.LinuxSyscall{deny("getpgid", arg(0, specs.OpNotEqual, base, 0))}, nil, []bool{true, false, true, true, true, true, true}},
		{"lt", []specs.LinuxSyscall{deny("getpgid", arg(0, specs.OpLessThan, base, 0))}, nil, []bool{true, false, false, false, false, false, false}},
		{"le", []specs.LinuxSyscall{deny("getpgid", arg(0, specs.OpLessEqual, base, 0))}, nil, []bool{true, true, false, false, false, false, false}},
		{"gt", []specs.LinuxSyscall{deny("getpgid", arg(0, specs.OpGreaterThan, base, 0))}, nil, []bool{false, false, true, true, true, true, true}},
		{"ge", []specs.LinuxSyscall{deny("getpgid", arg(0, specs.OpGreaterEqual, base, 0))}, nil, []bool{false, true, true, true, true, true, true}},
		// (pid & 0xf0) == 0x10: Value is the mask, ValueTwo the datum,
		// the way Docker's clone rule is written.
		{"masked eq", []specs.LinuxSyscall{deny("getpgid", arg(0, specs.OpMaskedEqual, 0xf0, 0x10))}, nil, []bool{false, false, false, true, true, false, false}},
		{"masked eq high bits", []specs.LinuxSyscall{deny("getpgid", arg(0, specs.OpMaskedEqual, 1<<32, 1<<32))}, nil, []bool{false, false, false, false, false, false, true}},
		{"repeated index is or", []specs.LinuxSyscall{deny("getpgid", arg(0, specs.OpEqualTo, base, 0), arg(0, specs.OpEqualTo, base+1, 0))}, nil, []bool{false, true, true, false, false, false, false}},
		{"separate entries are or", []specs.LinuxSyscall{deny("getpgid", arg(0, specs.OpEqualTo, base, 0)), deny("getpgid", arg(0, specs.OpEqualTo, base+0x20, 0))}, nil, []bool{false, true, false, false, false, true, false}},
		{"different indexes are and", []specs.LinuxSyscall{deny("getpriority", arg(0, specs.OpEqualTo, 7, 0), arg(1, specs.OpEqualTo, 9, 0))},
			[]string{getprio(7, 9), getprio(7, 8), getprio(6, 9)}, []bool{true, false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			prog, _, err := CompileSpec(&specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: tt.rules})
			if err != nil {
				t.Fatal(err)
			}
			calls := tt.calls
			if calls == nil {
				for _, p := range pgids {
					calls = append(calls, getpgid(p))
				}
			}
			got := probe(t, prog, "raw", calls...)
			for i, errno := range got {
				if (errno == unix.EDOM) != tt.match[i] {
					t.Errorf("%s: %s, want rule match %v", calls[i], errnoName(errno), tt.match[i])
				}
			}
		})
	}
}

func BenchmarkCompile(b *testing.B) {
	var prog []byte
	for b.Loop() {
		var err error
		if prog, err = Compile(DockerDefaultCaps); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(prog)/sockFilterSize), "insns")
}

// BenchmarkLoad stacks the default program up to loadsPerChild times in
// each throwaway child (the kernel caps a thread's stacked filters at 32768
// instructions). ns/op includes starting the children; load-ns/op is Load
// alone as the children time it.
func BenchmarkLoad(b *testing.B) {
	const loadsPerChild = 20
	split, err := CompileSplit(SandboxCaps)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		progs [][]byte // the last is timed
	}{
		{"docker", [][]byte{compile(b, DockerDefaultCaps)}},
		{"sandbox", [][]byte{compile(b, SandboxCaps)}},
		// What a guest loads when its forker loaded the base.
		{"sandbox-tail", [][]byte{split.Base, split.Tail}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var paths []string
			for i, prog := range bc.progs {
				path := filepath.Join(b.TempDir(), fmt.Sprintf("prog%d.bpf", i))
				if err := os.WriteFile(path, prog, 0o600); err != nil {
					b.Fatal(err)
				}
				paths = append(paths, path)
			}
			var total time.Duration
			for left := b.N; left > 0; left -= loadsPerChild {
				cmd := exec.Command(self(b))
				cmd.Env = childEnv(envChild+"=bench-load", envProg+"="+strings.Join(paths, string(os.PathListSeparator)), fmt.Sprintf("%s=%d", envCount, min(left, loadsPerChild)))
				total += childNanos(b, cmd)
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "load-ns/op")
		})
	}
}

// BenchmarkSyscall measures what the filter costs an allowed syscall
// (getppid) in the sandbox's steady state.
func BenchmarkSyscall(b *testing.B) {
	for _, filtered := range []bool{false, true} {
		b.Run(map[bool]string{false: "unfiltered", true: "filtered"}[filtered], func(b *testing.B) {
			count := fmt.Sprintf("%s=%d", envCount, b.N)
			var out string
			if filtered {
				out = underFilter(b, compile(b, DockerDefaultCaps), []string{count}, "bench-syscall", self(b))
			} else {
				cmd := exec.Command(self(b))
				cmd.Env = childEnv(envChild+"=bench-syscall", count)
				out = output(b, cmd)
			}
			b.ReportMetric(float64(parseNanos(b, out).Nanoseconds())/float64(b.N), "syscall-ns/op")
		})
	}
}

func childNanos(b *testing.B, cmd *exec.Cmd) time.Duration {
	b.Helper()
	return parseNanos(b, output(b, cmd))
}

func parseNanos(b *testing.B, out string) time.Duration {
	b.Helper()
	v, ok := strings.CutPrefix(strings.TrimSpace(out), "ns=")
	n, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil {
		b.Fatalf("child printed %q", out)
	}
	return time.Duration(n)
}
