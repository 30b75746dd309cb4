package test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/guestapi"
)

// pySyscall defines sc(nr, *args) in python: it makes a raw syscall and
// returns "OK" or the errno's name.
const pySyscall = `
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r != -1:
        return "OK"
    e = ctypes.get_errno()
    return errno.errorcode.get(e, str(e))
`

// pyConnect prints "OK" if it can connect to argv[1]:argv[2], else the
// errno's name (or the exception's, for a timeout).
const pyConnect = `
import errno, socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("OK")
except OSError as e:
    print(errno.errorcode.get(e.errno, "") if e.errno else type(e).__name__)
`

// pyExchange connects to argv[1]:argv[2], sends a line and prints "DATA"
// if anything comes back, else how it failed.
const pyExchange = `
import errno, socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    s.sendall(b"hello\n")
    print("DATA" if s.recv(16) else "EOF")
except OSError as e:
    print(errno.errorcode.get(e.errno, "") if e.errno else type(e).__name__)
`

// pyProcs lists the pids the sandbox can see with their argv.
const pyProcs = `
import os
for p in sorted(int(x) for x in os.listdir("/proc") if x.isdigit()):
    try:
        cmd = open("/proc/%d/cmdline" % p, "rb").read().replace(b"\0", b" ").replace(b"\n", b" ").decode().strip()
    except OSError:
        cmd = "?"
    print(p, cmd)
`

// TestEscapes tries, from inside a sandbox, what a hostile program would
// try to get out. Each attempt must fail, for the reason given where the
// kernel tells one; the controls show that the probe itself works. Host
// state the attempts aim at is checked from the host afterwards.
// Each attempt runs on both tiers, native and gVisor.
func TestEscapes(t *testing.T) {
	t.Parallel()
	if runtime.GOARCH != "amd64" {
		t.Skip("the syscall numbers below are x86_64's")
	}
	d := tierDaemon(t)
	forTiers(t, func(t *testing.T, tier string) { escapes(t, d, tier) })
}

func escapes(t *testing.T, d *Daemon, tier string) {
	id := d.Create(api.CreateRequest{Runtime: tier})
	guestPID := d.hostPID(id)

	// Host state the attempts aim at.
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	// What runs the sandbox on the host: paddock; the guest, the slim
	// binary paddock embeds (or paddock itself in a build that embeds
	// none), from a sealed memfd (native); runsc's sandbox process and
	// the guest binary it binds in read-only (gvisor).
	hostExes := []string{paddockBin, fmt.Sprintf("/proc/%d/exe", guestPID)}
	if tier == "native" {
		if l, err := os.Readlink(hostExes[1]); err != nil || !strings.HasPrefix(l, "/memfd:paddock-guest") {
			t.Errorf("the guest runs %q (%v), not the sealed memfd", l, err)
		}
	} else {
		// Guest binaries are kept by content (guests/<sha256>).
		guests, _ := filepath.Glob(filepath.Join(d.RunDir, "gvisor", "guests", "*"))
		if len(guests) == 0 {
			t.Fatalf("no guest binary under %s", filepath.Join(d.RunDir, "gvisor", "guests"))
		}
		hostExes = append(hostExes, guests...)
	}
	exeSums := map[string]string{}
	for _, p := range hostExes {
		exeSums[p] = fileSHA256(t, p)
	}
	// A native guest starts as the fast guest, holding the guest binary
	// at fd 5 for its handover (guestapi.HandoverExeFD): a request it
	// does not serve makes the guest binary PID 1's program, the one
	// change /proc/PID/exe may show. That binary is sealed as well.
	var handedTo string
	if tier == "native" {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", guestPID, guestapi.HandoverExeFD)); err == nil && strings.HasPrefix(l, "/memfd:paddock-guest") {
			handedTo = fileSHA256(t, fmt.Sprintf("/proc/%d/fd/%d", guestPID, guestapi.HandoverExeFD))
		}
	}
	tag := randHex(6)
	marker := "/root/paddock-e2e-secret-" + tag
	secret := "secret-" + tag
	if err := os.WriteFile(marker, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(marker) })
	usrProbe := "/usr/paddock-e2e-probe-" + tag
	t.Cleanup(func() { os.Remove(usrProbe) })
	shadow, err := os.ReadFile("/etc/shadow")
	if err != nil {
		t.Fatal(err)
	}
	var rootShadow string
	for _, l := range strings.Split(string(shadow), "\n") {
		if strings.HasPrefix(l, "root:") {
			rootShadow = l
		}
	}
	if rootShadow == "" {
		t.Fatal("host /etc/shadow has no root line")
	}
	sleepSecs := 1000000 + int(syscall.Getpid()%100000)*2
	hostSleep := startHostProcess(t, "sleep", strconv.Itoa(sleepSecs))
	panicValue, err := os.ReadFile("/proc/sys/kernel/panic")
	if err != nil {
		t.Fatal(err)
	}
	thp := ""
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err == nil {
		if m := regexp.MustCompile(`\[(\w+)\]`).FindStringSubmatch(string(b)); m != nil {
			thp = m[1]
		}
	}
	loopback, loopbackHits := listenCounting(t, "127.0.0.1:0")
	var external string
	var externalHits *atomic.Int64
	if ip := hostIPv4(); ip != "" {
		external, externalHits = listenCounting(t, ip+":0")
	}

	// Checks on an attempt's outcome.
	fails := func(reasons ...string) func(*testing.T, execResult) {
		return func(t *testing.T, r execResult) {
			t.Helper()
			if r.ExitCode == 0 {
				t.Errorf("attempt succeeded: %v", r)
				return
			}
			for _, why := range reasons {
				if strings.Contains(strings.ToLower(r.Stderr), strings.ToLower(why)) {
					return
				}
			}
			t.Errorf("attempt failed, but not for a reason in %q: %v", reasons, r)
		}
	}
	prints := func(want ...string) func(*testing.T, execResult) {
		return func(t *testing.T, r execResult) {
			t.Helper()
			got := strings.TrimSpace(r.Stdout)
			for _, w := range want {
				if got == w {
					return
				}
			}
			t.Errorf("got %q, want one of %q: %v", got, want, r)
		}
	}
	sh := func(script string) []string { return []string{"sh", "-c", script} }
	py := func(program string, args ...string) []string {
		return append([]string{"python3", "-c", program}, args...)
	}
	sys := func(call string) []string { return py(pySyscall + "print(" + call + ")") }
	const (
		ptraceAttach  = "sc(101, 16, %d, 0, 0)"
		cloneNewUser  = 0x10000000
		cloneNewNS    = 0x00020000
		msBind, msRec = 4096, 16384
	)

	tests := []struct {
		name  string
		cmd   []string
		check func(*testing.T, execResult)
		skip  string
		// gvisor, when set, replaces the attempt under gVisor, whose
		// kernel answers it (the comment says how).
		gvisor *attempt
	}{
		// Mounts and namespaces.
		{name: "mount tmpfs", cmd: sh("mount -t tmpfs none /mnt"), check: fails("permission denied", "not permitted")},
		{name: "mount syscall", cmd: py(pySyscall + `print("OK" if libc.mount(b"none", b"/mnt", b"tmpfs", 0, None) == 0 else errno.errorcode[ctypes.get_errno()])`), check: prints("EPERM")},
		{name: "bind mount of /", cmd: py(pySyscall + fmt.Sprintf(`print("OK" if libc.mount(b"/", b"/mnt", None, %d, None) == 0 else errno.errorcode[ctypes.get_errno()])`, msBind|msRec)), check: prints("EPERM")},
		{name: "nothing got mounted", cmd: sh("grep ' /mnt ' /proc/self/mountinfo || echo none"), check: prints("none")},
		// The classic chroot escape (Docker's capability set keeps
		// CAP_SYS_CHROOT): a chroot below the cwd, then ".." past the
		// root. It must end where it began: the sandbox's root sits on
		// top of the forker's at "/", and ".." at the top of that
		// stack leads back to it. Under gVisor it ends in the sentry's
		// own empty root, above the container's, in its kernel.
		{name: "chroot escape", cmd: py(`
import os
before = os.stat("/")
os.makedirs("/tmp/jail", exist_ok=True)
fd = os.open("/", os.O_RDONLY)
os.chroot("/tmp/jail")
os.fchdir(fd)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
after = os.stat("/")
same = (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
print("same" if same else "escaped to: " + " ".join(sorted(os.listdir("/"))))
`), check: prints("same"), gvisor: &attempt{check: prints("escaped to:")}},
		// Docker's seccomp profile refuses user namespaces on both tiers
		// (under gVisor its kernel, the sentry, enforces the profile).
		{name: "unshare -U -r", cmd: sh("unshare -U -r true"), check: fails("not permitted")},
		{name: "unshare -U -r --map-root-user id", cmd: sh("unshare --user --map-user=0 --map-group=0 id -u"), check: fails("not permitted")},
		{name: "unshare -m", cmd: sh("unshare -m true"), check: fails("not permitted")},
		{name: "unshare(CLONE_NEWUSER)", cmd: sys(fmt.Sprintf("sc(272, %d)", cloneNewUser)), check: prints("EPERM")},
		{name: "clone(CLONE_NEWUSER)", cmd: sys(fmt.Sprintf("sc(56, %d, 0, 0, 0, 0)", cloneNewUser|17)), check: prints("EPERM")},
		{name: "unshare(CLONE_NEWNS)", cmd: sys(fmt.Sprintf("sc(272, %d)", cloneNewNS)), check: prints("EPERM")},

		// ptrace.
		{name: "ptrace the guest (pid 1)", cmd: sys(fmt.Sprintf(ptraceAttach, 1)), check: prints("EPERM")},
		{name: "ptrace a host pid", cmd: sys(fmt.Sprintf(ptraceAttach, hostSleep.Process.Pid)), check: prints("ESRCH", "EPERM")},
		{name: "control: ptrace own child", cmd: py(pySyscall + `
import time
pid = os.fork()
if pid == 0:
    time.sleep(5)
    os._exit(0)
print(sc(101, 16, pid, 0, 0))
os.kill(pid, 9)
os.waitpid(pid, 0)
`), check: prints("OK")},

		// /proc and /sys. Each write, should it work, writes the host's
		// current value (or a help request), so that nothing changes.
		// gVisor's /proc and /sys are its kernel's: a write is refused
		// (EPERM, EIO) or the file is not there.
		{name: "write /proc/sys", cmd: sh("echo " + strings.TrimSpace(string(panicValue)) + " > /proc/sys/kernel/panic"), check: fails("read-only", "permission denied"),
			gvisor: &attempt{check: fails("not permitted")}},
		{name: "write /proc/sys/vm", cmd: sh("cat /proc/sys/vm/overcommit_memory > /tmp/v && cat /tmp/v > /proc/sys/vm/overcommit_memory"), check: fails("read-only", "permission denied"),
			gvisor: &attempt{check: fails("not permitted", "input/output error")}},
		{name: "write /proc/sysrq-trigger", cmd: sh("echo h > /proc/sysrq-trigger"), check: fails("read-only", "permission denied", "nonexistent", "no such file"),
			gvisor: &attempt{check: fails("i/o error", "no such file")}},
		{name: "write /sys", cmd: sh("echo " + thp + " > /sys/kernel/mm/transparent_hugepage/enabled"), check: fails("read-only", "permission denied"), skip: map[bool]string{true: "host has no transparent_hugepage"}[thp == ""],
			gvisor: &attempt{check: fails("nonexistent", "read-only")}},
		{name: "raise own cgroup limits", cmd: sh("ok=0; for f in /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max; do [ -e $f ] && echo max > $f 2>/dev/null && ok=1; done; echo $ok"), check: prints("0")},

		// Host files.
		{name: "read host /etc/shadow", cmd: sh("cat /etc/shadow"), check: func(t *testing.T, r execResult) {
			if strings.Contains(r.Stdout, rootShadow) || r.Stdout == string(shadow) {
				t.Errorf("the sandbox's /etc/shadow holds the host's root entry %q", rootShadow)
			}
		}},
		{name: "read host /root", cmd: sh("ls -a /root; cat /root/" + filepath.Base(marker) + " /proc/*/root/root/" + filepath.Base(marker)), check: func(t *testing.T, r execResult) {
			if strings.Contains(r.Stdout, secret) || strings.Contains(r.Stdout, filepath.Base(marker)) {
				t.Errorf("the host's /root/%s is visible: %v", filepath.Base(marker), r)
			}
			if !strings.Contains(r.Stdout, "..") {
				t.Errorf("control: ls -a /root listed nothing: %v", r)
			}
			fails("no such file", "permission denied")(t, r)
		}},
		{name: "write host /usr", cmd: sh("touch " + usrProbe), check: fails("read-only")},
		{name: "open a host binary for writing", cmd: sh(": >> /usr/bin/env"), check: fails("read-only")},

		// Processes.
		// The control waits (2 s at most) for the background job to have
		// exec'd sleep: under gVisor the listing could come first.
		{name: "see host processes", cmd: []string{"sh", "-c", `sleep 2345 & for i in $(seq 200); do case "$(tr '\0' ' ' < /proc/$!/cmdline 2>/dev/null)" in sleep*) break;; esac; sleep 0.01; done; python3 -c "$1"; kill $!`, "sh", pyProcs}, check: func(t *testing.T, r execResult) {
			var pid1, control bool
			for _, l := range lines(r.Stdout) {
				f := strings.Fields(l)
				if len(f) >= 3 && f[1] == "sleep" && f[2] == strconv.Itoa(sleepSecs) {
					t.Errorf("host process visible: %q", l)
				}
				if len(f) >= 3 && f[1] == "sleep" && f[2] == "2345" {
					control = true
				}
				if len(f) >= 2 && f[0] == "1" && strings.Contains(f[1], "paddock") {
					pid1 = true
				}
			}
			if !pid1 || !control {
				t.Errorf("want pid 1 the guest and the sandbox's own sleep visible: %v", r)
			}
			if n := len(lines(r.Stdout)); n > 10 {
				t.Errorf("%d processes visible, want only the sandbox's few: %v", n, r)
			}
		}},

		// Network.
		{name: "host loopback service", cmd: py(pyConnect, "127.0.0.1", port(loopback)), check: prints("ECONNREFUSED")},
		// Every TCP connect from a sandbox is redirected to the egress
		// proxy, whose accept completes the handshake before it resets a
		// denied connection: "OK" here is the proxy, not the host. What
		// decides is that the host's listener accepted nothing (checked
		// below), and that no byte comes back.
		{name: "host address", cmd: py(pyExchange, host(external), port(external)), check: func(t *testing.T, r execResult) {
			if strings.HasPrefix(strings.TrimSpace(r.Stdout), "DATA") {
				t.Errorf("reached the host at %s: %v", external, r)
			}
		}, skip: map[bool]string{true: "host has no non-loopback IPv4 address"}[external == ""]},
		// Loopback, and eth0: the link to paddock's egress gateway, which
		// with no policy reaches nothing (the egress tests go further).
		{name: "only loopback and the gateway link", cmd: py("import socket; print(' '.join(n for _, n in socket.if_nameindex()))"), check: prints("lo eth0")},
		{name: "control: loopback service inside", cmd: py(`
import socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname(), timeout=3)
a, _ = srv.accept()
c.sendall(b"ping")
print(a.recv(4).decode())
`), check: prints("ping")},

		// Syscalls Docker's profile denies: EPERM on both tiers (gVisor's
		// kernel alone would answer some with ENOSYS or let them run).
		{name: "init_module", cmd: sys("sc(175, 0, 0, 0)"), check: prints("EPERM")},
		{name: "finit_module", cmd: sys("sc(313, 0, 0, 0)"), check: prints("EPERM")},
		{name: "delete_module", cmd: sys("sc(176, 0, 0)"), check: prints("EPERM")},
		{name: "keyctl", cmd: sys("sc(250, 0, 0, 0, 0)"), check: prints("EPERM")},
		{name: "add_key", cmd: sys("sc(248, 0, 0, 0, 0, 0)"), check: prints("EPERM")},
		{name: "request_key", cmd: sys("sc(249, 0, 0, 0, 0)"), check: prints("EPERM")},
		{name: "bpf", cmd: sys("sc(321, 0, 0, 0)"), check: prints("EPERM")},
		{name: "perf_event_open", cmd: sys("sc(298, 0, 0, -1, -1, 0)"), check: prints("EPERM")},
		{name: "userfaultfd", cmd: sys("sc(323, 0)"), check: prints("EPERM")},
		{name: "kexec_load", cmd: sys("sc(246, 0, 0, 0, 0)"), check: prints("EPERM")},
		{name: "setns", cmd: sys("sc(308, 0, 0)"), check: prints("EPERM")},
		{name: "control: getpid syscall", cmd: sys("'OK' if sc(39) == 'OK' and os.getpid() > 1 else 'broken'"), check: prints("OK")},

		// Devices.
		// On the disk (/tmp is the root's on both tiers) no device node
		// is made. In a tmpfs gVisor's kernel makes one (CAP_MKNOD is
		// Docker's), in its own memory: it opens no device of the host.
		{name: "mknod block device", cmd: sh("mknod /tmp/sda b 8 0"), check: fails("not permitted")},
		{name: "mknod block device in a tmpfs", cmd: sh("mknod /dev/shm/sda b 8 0"), check: fails("not permitted"),
			gvisor: &attempt{cmd: sh("mknod /dev/shm/sda b 8 0 && head -c 1 /dev/shm/sda"), check: fails("no such device")}},
		{name: "no block device made", cmd: sh("for f in /tmp/sda /dev/shm/sda; do test -e $f && echo exists || echo absent; done"), check: prints("absent\nabsent"),
			gvisor: &attempt{cmd: sh("test ! -e /tmp/sda && head -c 1 /dev/shm/sda"), check: fails("no such device")}},
		{name: "control: mknod fifo", cmd: sh("mknod /tmp/fifo p && test -p /tmp/fifo && echo fifo"), check: prints("fifo")},

		// Hostname: refused, or confined to the sandbox's UTS namespace
		// (the host's is checked below).
		{name: "hostname", cmd: sh("hostname evil-" + tag + "; hostname"), check: func(t *testing.T, r execResult) {
			t.Logf("inside: %v", r)
		}},

		// The guest binary (CVE-2019-5736).
		{name: "read /proc/1/exe", cmd: sh("cat /proc/1/exe > /dev/null"), check: fails("permission denied")},
		{name: "write /proc/1/exe", cmd: sh("echo x > /proc/1/exe"), check: fails("permission denied", "text file busy")},
		{name: "cp over /proc/1/exe", cmd: sh("cp /bin/sh /proc/1/exe"), check: fails("permission denied", "text file busy")},
		{name: "open /proc/1/exe read-write", cmd: py(`
import errno
try:
    open("/proc/1/exe", "r+b")
    print("OK")
except OSError as e:
    print(errno.errorcode.get(e.errno, ""))
`), check: prints("EACCES", "EPERM", "ETXTBSY")},
		// Listing /proc/1/fd may work (root in the sandbox owns the
		// entries); following or opening them must not.
		{name: "guest fds, cwd and root", cmd: py(`
import os
got = []
try:
    fds = ["fd/" + n for n in os.listdir("/proc/1/fd")]
except OSError:
    fds = []
for p in fds + ["cwd", "root", "exe"]:
    p = "/proc/1/" + p
    for probe in (os.readlink, lambda q: os.close(os.open(q, os.O_PATH))):
        try:
            probe(p)
            got.append(p)
        except OSError:
            pass
print(" ".join(got) or "denied")
`), check: prints("denied")},
		{name: "guest environ", cmd: sh("cat /proc/1/environ"), check: fails("permission denied")},
		{name: "guest map_files", cmd: sh("ls /proc/1/map_files"), check: fails("permission denied"),
			gvisor: &attempt{check: fails("no such file")}}, // gVisor has none
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.skip != "" {
				t.Skip(tt.skip)
			}
			cmd, check := tt.cmd, tt.check
			if g := tt.gvisor; g != nil && tier == "gvisor" {
				if g.cmd != nil {
					cmd = g.cmd
				}
				check = g.check
			}
			check(t, d.run(id, "", cmd...))
		})
	}

	// Host state, checked from the host.
	if now, _ := os.Hostname(); now != hostname {
		t.Errorf("host hostname changed from %q to %q", hostname, now)
	}
	for p, was := range exeSums {
		if sum := fileSHA256(t, p); sum != was && (p != hostExes[1] || sum != handedTo) {
			t.Errorf("%s (the sandbox's host pid is %d) changed", p, guestPID)
		}
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != secret+"\n" {
		t.Errorf("host marker %s changed: %q %v", marker, b, err)
	}
	if _, err := os.Stat(usrProbe); err == nil {
		t.Errorf("the sandbox created %s on the host", usrProbe)
	}
	if b, _ := os.ReadFile("/proc/sys/kernel/panic"); string(b) != string(panicValue) {
		t.Errorf("host kernel.panic changed from %q to %q", panicValue, b)
	}
	if !alive(hostSleep.Process.Pid) {
		t.Errorf("host process %d died", hostSleep.Process.Pid)
	}
	if n := loopbackHits.Load(); n != 0 {
		t.Errorf("the host loopback listener accepted %d connections", n)
	}
	if externalHits != nil && externalHits.Load() != 0 {
		t.Errorf("the host's %s listener accepted %d connections", external, externalHits.Load())
	}
	if out := d.Sh(id, "echo alive"); out != "alive\n" || d.hostPID(id) != guestPID {
		t.Errorf("sandbox after the attempts: %q, guest pid %d (was %d)", out, d.hostPID(id), guestPID)
	}
}

// TestUserNamespace: root in a sandbox is an unprivileged uid range on the
// host, and host files show sensible owners inside; under gVisor it is
// no host user at all.
func TestUserNamespace(t *testing.T) {
	t.Parallel()
	d := tierDaemon(t)
	forTiers(t, func(t *testing.T, tier string) {
		if tier == "gvisor" {
			gvisorUsers(t, d)
			return
		}
		nativeUsers(t, d)
	})
}

// gvisorUsers: under gVisor, root in the sandbox is its kernel's user;
// no process of the sandbox is a host process. What runs on the host is
// runsc's (its sentry, gofer and the systrap stubs that hold the
// sandbox's address spaces), each under seccomp, with no_new_privs and
// without CAP_SYS_ADMIN: gVisor's own confinement, the reason for the tier.
func gvisorUsers(t *testing.T, d *Daemon) {
	id := d.Create(api.CreateRequest{Runtime: "gvisor"})
	d.Sh(id, "sleep 300 >/dev/null 2>&1 &")
	if out := d.Sh(id, "id -u"); out != "0\n" {
		t.Errorf("inside: id -u %q, want 0", out)
	}
	sb := d.get(id)
	pids := sandboxProcs(sb)
	if len(pids) < 2 {
		t.Fatalf("sandbox cgroup %s lists %d processes, want runsc's sentry and gofer at least", sb.Runtime.Cgroup, len(pids))
	}
	const capSysAdmin = 21
	for _, p := range pids {
		b, err := os.ReadFile("/proc/" + p + "/status")
		if err != nil {
			continue // exited meanwhile
		}
		cmd := procCmdline(mustAtoi(t, p))
		if strings.Contains(cmd, "sleep") {
			t.Errorf("the sandbox's sleep is a host process: %s %s", p, cmd)
		}
		st := map[string]string{}
		for _, l := range lines(string(b)) {
			if k, v, ok := strings.Cut(l, ":"); ok {
				st[k] = strings.TrimSpace(v)
			}
		}
		capEff, _ := strconv.ParseUint(st["CapEff"], 16, 64)
		if st["NoNewPrivs"] != "1" || st["Seccomp"] != "2" || capEff&(1<<capSysAdmin) != 0 {
			t.Errorf("host process %s (%q) of the sandbox: no_new_privs %s, seccomp %s, CapEff %s; want 1, 2 (filter) and no CAP_SYS_ADMIN",
				p, cmd, st["NoNewPrivs"], st["Seccomp"], st["CapEff"])
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func nativeUsers(t *testing.T, d *Daemon) {
	id := d.Create(api.CreateRequest{})
	d.Sh(id, "echo x > /workspace/owned-by-root; echo y > /workspace/owned-by-1000; chown 1000:1000 /workspace/owned-by-1000; sleep 300 >/dev/null 2>&1 &")
	sb := d.get(id)
	base := sb.Runtime.UIDBase
	if base == 0 || base < d.UIDStart {
		t.Fatalf("runtime uid_base %d; want a range at or above --uid-start %d", base, d.UIDStart)
	}
	if out := d.Sh(id, "id -u; cat /proc/self/uid_map"); !regexp.MustCompile(`^0\n\s*0\s+` + strconv.Itoa(int(base)) + `\s+65536\n$`).MatchString(out) {
		t.Errorf("inside: id -u and uid_map: %q; want root mapped to %d", out, base)
	}
	// Its processes start with no signal blocked or ignored, whatever
	// the forker and the guest block for themselves.
	if out := d.Sh(id, "grep -E '^Sig(Blk|Ign)' /proc/self/status"); out != "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n" {
		t.Errorf("inside: a process's signal mask and ignored signals: %q, want none", out)
	}

	// Every process of the sandbox runs as a uid of its range on the host.
	pids := sandboxProcs(sb)
	if len(pids) < 2 {
		t.Errorf("sandbox cgroup %s lists %d processes, want the guest and a sleep", sb.Runtime.Cgroup, len(pids))
	}
	for _, p := range pids {
		pid, _ := strconv.Atoi(p)
		uid, err := procUID(pid)
		if err != nil {
			continue // exited meanwhile
		}
		if uid == 0 || uid < base || uid-base >= 65536 {
			t.Errorf("sandbox process %d (%s) runs as host uid %d, outside %d..%d", pid, procCmdline(pid), uid, base, base+65535)
		}
	}
	if uid, err := procUID(sb.Runtime.HostPID); err != nil || uid != base {
		t.Errorf("guest host pid %d: uid %d (%v), want %d", sb.Runtime.HostPID, uid, err, base)
	}

	// Files it writes belong to its range on the host.
	for name, want := range map[string]uint32{"owned-by-root": base, "owned-by-1000": base + 1000} {
		fi, err := os.Lstat(fmt.Sprintf("/proc/%d/root/workspace/%s", sb.Runtime.HostPID, name))
		if err != nil {
			t.Errorf("stat from the host: %v", err)
			continue
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != want || st.Gid != want {
			t.Errorf("/workspace/%s is %d:%d on the host, want %d:%d", name, st.Uid, st.Gid, want, want)
		}
	}

	// Host files in the host image show their owners, not nobody.
	v, err := d.Client().Version(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !v.Idmapped {
		t.Skip("the daemon reports no idmapped mounts; host files show as nobody")
	}
	if !sb.Runtime.Idmapped {
		t.Errorf("daemon reports idmapped mounts, sandbox runtime does not")
	}
	var hostOwners []string
	for _, p := range []string{"/usr", "/usr/bin/env", "/usr/bin/python3"} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		hostOwners = append(hostOwners, fmt.Sprintf("%d:%d", st.Uid, st.Gid))
	}
	want := strings.Join(hostOwners, "\n") + "\n"
	if got := d.Sh(id, "stat -c %u:%g /usr /usr/bin/env /usr/bin/python3"); got != want {
		t.Errorf("owners of /usr files inside: %q, want the host's %q", got, want)
	}
	if got := d.Sh(id, "stat -c %U /usr/bin/env"); got != "root\n" {
		t.Errorf("/usr/bin/env owner by name inside: %q, want root", got)
	}
	// And they stay read-only to root in the sandbox.
	if r := d.sh(id, "touch /usr/bin/env"); r.ExitCode == 0 {
		t.Errorf("root in the sandbox could touch the host's /usr/bin/env")
	}
}

// sandboxProcs lists the host pids in sb's cgroup.
func sandboxProcs(sb *api.Sandbox) []string {
	for _, dir := range cgroupDirs(sb.Runtime.Cgroup) {
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			return strings.Fields(string(b))
		}
	}
	return nil
}

// attempt is an escape attempt's command and the check of its outcome.
type attempt struct {
	cmd   []string
	check func(*testing.T, execResult)
}

// listenCounting listens on addr until the test ends and counts the
// connections it accepts.
func listenCounting(t *testing.T, addr string) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), &n
}

// hostIPv4 returns one of the host's non-loopback IPv4 addresses, or "".
func hostIPv4() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			return ipn.IP.String()
		}
	}
	return ""
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func host(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return h
}
