//go:build linux && cgo

// The forker (package doc): a single-threaded C process that forks each
// guest into its new namespaces and execs it from the sealed guest binary.
// It runs from the daemon's own binary before the Go runtime starts: the
// constructor below takes the process when its first argument is the
// forker's verb, and never returns to Go. Being one thread with a few
// pages of memory is the point: its child (a CLONE_VM child on x86-64, a
// fork elsewhere) copies no page tables or few, leaves no copy-on-write
// faults behind in the forker, and flushes no other CPU's TLB (the Go
// forker paid all three for every guest; see docs/exec.md, "The forker
// in C" and "The forker's child").
//
// The daemon is its only peer (fd 3, a SOCK_SEQPACKET socket): a request
// is a 12-byte record (forker_linux.go's Request.Encode) with its
// descriptors, in order: stdin, log, sync, listen, then the cgroup (if
// asked for) and the network namespace (if asked for). The reply is the
// guest's pid (int32, little endian), the errno of a failure (int32), and
// a message; a pidfd comes with a success.

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/close_range.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "forker.h"

#define FDS_BASE 4 // stdin, log, sync, listen
#define FDS_MAX 8
#define MAX_DEVICES 16

static int exe_fd = -1;    // the sealed guest binary
static int fast_fd = -1;   // the sealed fast guest, if the daemon gave one
static int own_netns = -1; // the host's, to return to after a guest's
static int broken;         // a namespace could not be left: stop after the reply

// fail formats an error for the reply; it returns -1.
static int fail(char *msg, size_t len, int *err, int e, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, len, fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n < len)
		snprintf(msg + n, len - n, ": %s", strerror(e));
	*err = e;
	return -1;
}

static void die(const char *what) {
	dprintf(2, "paddock guest-forker: %s: %s\n", what, strerror(errno));
	_exit(1);
}

// high moves fd to 10 or above (close-on-exec), out of the way of the
// descriptors a guest gets (0-5).
static int high(int fd) {
	if (fd < 0 || fd >= 10)
		return fd;
	int moved = fcntl(fd, F_DUPFD_CLOEXEC, 10);
	int e = errno;
	close(fd);
	errno = e;
	return moved;
}

// isolate_mounts replaces the forker's copy of the host's mount table
// with a minimal root: a read-only tmpfs holding /tmp (where a guest
// stages its root), fresh proc and sysfs instances (the kernel lets a
// user namespace mount proc and sysfs only where one is already fully
// visible, and /proc serves the forker's and guests' /proc/self), and
// the devices guests bind. The host's tree is detached at once, so
// neither the forker nor a guest forked from it holds a host mount: a
// guest's mount namespace is a copy of its forker's, and a copy of the
// host's would keep every host mount that existed at the fork alive for
// as long as the guest waits in a pool. A guest's copy of this tree stays
// in its namespace, beneath its sandbox's root (the guest's enterRoot):
// add nothing of the host's here.
static void isolate_mounts(char **devices, int ndevices) {
	// The daemon starts us in a new mount namespace; one of our own as
	// well, so that nothing done here reaches the host's even when the
	// verb is run by hand.
	if (unshare(CLONE_NEWNS))
		die("making a mount namespace");
	if (mount("", "/", NULL, MS_REC | MS_PRIVATE, NULL))
		die("making mounts private");
	// Any directory of the host's tree serves as the mount point: the
	// tmpfs becomes the root below.
	if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=16k"))
		die("mounting the forker's root");
	const char *dirs[] = {"/tmp/proc", "/tmp/sys", "/tmp/dev", "/tmp/tmp"};
	for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
		if (mkdir(dirs[i], 0755))
			die(dirs[i]);
	for (int i = 0; i < ndevices; i++) {
		char src[64], dst[64];
		if (strchr(devices[i], '/') || snprintf(src, sizeof src, "/dev/%s", devices[i]) >= (int)sizeof src) {
			errno = EINVAL;
			die(devices[i]);
		}
		snprintf(dst, sizeof dst, "/tmp/dev/%s", devices[i]);
		int fd = open(dst, O_CREAT | O_EXCL | O_CLOEXEC | O_RDONLY, 0644);
		if (fd < 0)
			die(dst);
		close(fd);
		if (mount(src, dst, NULL, MS_BIND, NULL))
			die(src);
	}
	// The flags a guest's own proc and sysfs are mounted with, or fewer:
	// a new instance may not be less restricted than the visible one.
	if (mount("proc", "/tmp/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		die("mounting proc");
	if (mount("sysfs", "/tmp/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		die("mounting sysfs");
	if (chdir("/tmp"))
		die("entering the forker's root");
	// runc's pivot_root(".", ".") idiom: the old root ends up on top of
	// the new one and is detached right away.
	if (syscall(SYS_pivot_root, ".", "."))
		die("pivot_root");
	if (umount2(".", MNT_DETACH))
		die("detaching the host's root");
	if (chdir("/"))
		die("chdir /");
	if (mount("", "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		die("making the forker's root read-only");
}

// write_file writes s to /proc/PID/name.
static int write_file(pid_t pid, const char *name, const char *s) {
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, s, strlen(s));
	int e = errno;
	close(fd);
	if (n != (ssize_t)strlen(s)) {
		errno = n < 0 ? e : EIO;
		return -1;
	}
	return 0;
}

// The child shares the forker's memory (CLONE_VM) where the trampoline
// below is written for the architecture: copying even the forker's few
// page tables, and tearing the copy down again at the exec, made a fork
// cost about 1 ms on a paravirtualised host where a CLONE_VM child costs
// 0.25 ms with its namespaces (docs/exec.md, "The forker's child").
// Sharing memory, the child runs beside the forker on a stack of its own
// and must not touch what the forker uses: it makes its system calls
// through sys6, which leaves errno (the forker's) alone, and writes only
// to its stack. Everywhere else the child is a fork, as before.
#if defined(__x86_64__)
#define VM_CHILD 1
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "0"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}
#else
#define VM_CHILD 0
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
	long r = syscall(n, a, b, c, d, e, f);
	return r < 0 ? -errno : r;
}
#endif
#define sys3(n, a, b, c) sys6(n, (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define sys5(n, a, b, c, d, e) sys6(n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), 0)

// CHILD_STACK is the size of the CLONE_VM child's stack, below which a
// page is left inaccessible.
#define CHILD_STACK (64 << 10)
static char *child_stack; // its top; set by forker_main

// The child's side of a fork, up to the guest's exec; it reports a failure
// on status (the errno, then the step) and exits.
struct child_args {
	int go, go_parent, status;
	int fds[FDS_BASE];
};

__attribute__((noreturn)) static void child_fail(int status, long ret, const char *step) {
	int e = (int)-ret;
	char rep[4 + 60];
	memcpy(rep, &e, 4);
	size_t n = strlen(step);
	if (n > sizeof rep - 4)
		n = sizeof rep - 4;
	memcpy(rep + 4, step, n);
	sys3(SYS_write, status, rep, 4 + n);
	for (;;)
		sys3(SYS_exit, 127, 0, 0);
}

__attribute__((noreturn)) static void child(const struct child_args *a) {
	char c;
	long r;
	// The parent writes the uid and gid maps, then says go (or kills
	// us). Our copy of its end is closed first: if the forker dies (with
	// its daemon), the read ends instead of waiting for ever.
	sys3(SYS_close, a->go_parent, 0, 0);
	if (sys3(SYS_read, a->go, &c, 1) != 1)
		for (;;)
			sys3(SYS_exit, 127, 0, 0);
	if ((r = sys3(SYS_setsid, 0, 0, 0)) < 0)
		child_fail(a->status, r, "setsid");
	// Root of the new user namespace, before exec: our host uid (0) is
	// not mapped in it, and exec would drop every capability.
	if ((r = sys3(SYS_setgroups, 0, NULL, 0)))
		child_fail(a->status, r, "setgroups");
	if ((r = sys3(SYS_setresgid, 0, 0, 0)))
		child_fail(a->status, r, "setresgid");
	if ((r = sys3(SYS_setresuid, 0, 0, 0)))
		child_fail(a->status, r, "setresuid");
	// stdin, stdout and stderr (both the log), sync, listen. Every source
	// is at 10 or above (high), so no dup3 below clobbers another source
	// (nor is any its own target, which dup3 refuses).
	int src[5] = {a->fds[0], a->fds[1], a->fds[1], a->fds[2], a->fds[3]};
	for (int i = 0; i < 5; i++)
		if ((r = sys3(SYS_dup3, src[i], i, 0)) < 0)
			child_fail(a->status, r, "dup2");
	// The forker blocks SIGCHLD and SIGPIPE; the kernel's sigset is 64
	// bits.
	uint64_t none = 0;
	sys5(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, sizeof none, 0);
	// The guest starts with its runtime monitor's timer slack
	// (internal/sysmon says why): the slack passes through exec and on to
	// the threads a thread starts, so sysmon, which the runtime starts
	// first, has it from its first sleep on, through the runtime's start
	// and the package inits, where it used to poll every 70 us. The guest
	// gives its main thread the kernel's default back (sysmon.Settle).
	if ((r = sys5(SYS_prctl, PR_SET_TIMERSLACK, GUEST_SLACK_NS, 0, 0, 0)))
		child_fail(a->status, r, "prctl(PR_SET_TIMERSLACK)");
	char *argv[] = {"paddock", GUEST_VERB, NULL};
	// The guest runs with one P (guest.Run says why). Set before the
	// runtime starts, it never makes the second P, its cache and the
	// thread that serves it. memprofilerate=0: the runtime profiles a
	// process's first allocation whatever the rate, before the rate the
	// linker chose takes effect; set here it spares each guest that
	// stack walk. The guest gives its children their own environments,
	// never this one.
	char *envp[] = {"GOMAXPROCS=1", "GODEBUG=memprofilerate=0", NULL};
	// With the fast guest, the guest binary goes along at FD_FAST for
	// the fast guest to hand over to (guestapi.Handover); the fast guest
	// keeps it close-on-exec.
	if (fast_fd >= 0 && (r = sys3(SYS_dup3, exe_fd, FD_FAST, 0)) < 0)
		child_fail(a->status, r, "dup2");
	// Nothing else goes on to the guest, and from it to the sandbox's
	// processes: descriptors the daemon inherited without close-on-exec
	// from whatever started it (a shell's, a supervisor's) are in every
	// process it starts, the forker too.
	int first = fast_fd >= 0 ? FD_FAST + 1 : FD_FAST;
	if (sys3(SYS_close_range, first, ~0U, CLOSE_RANGE_CLOEXEC)) {
		struct {
			uint64_t cur, max;
		} rl; // the kernel's rlimit64
		int last = sys5(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &rl, 0) || rl.cur > 1 << 20 ? 1 << 16 : (int)rl.cur;
		for (int fd = first; fd < last; fd++)
			sys3(SYS_fcntl, fd, F_SETFD, FD_CLOEXEC);
	}
	r = sys5(SYS_execveat, fast_fd >= 0 ? fast_fd : exe_fd, "", argv, envp, AT_EMPTY_PATH);
	child_fail(a->status, r, "exec");
}

#if VM_CHILD
// clone_vm is clone3 for a CLONE_VM child with a stack of its own: the
// child, on that stack, calls fn(arg), which never returns. It returns
// the child's pid, or -errno.
static long clone_vm(struct clone_args *ca, void (*fn)(const struct child_args *), const struct child_args *arg) {
	register void (*r12)(const struct child_args *) __asm__("r12") = fn;
	register const struct child_args *r13 __asm__("r13") = arg;
	long ret;
	// The kernel keeps every register but rax, rcx and r11 across the
	// call; the child starts at the instruction after it, its stack
	// pointer at the top of ca->stack (16-byte aligned, as a call
	// wants).
	__asm__ volatile("syscall\n\t"
			 "testq %%rax, %%rax\n\t"
			 "jnz 1f\n\t"
			 "xorl %%ebp, %%ebp\n\t"
			 "movq %%r13, %%rdi\n\t"
			 "callq *%%r12\n\t"
			 "ud2\n"
			 "1:"
			 : "=a"(ret)
			 : "0"((long)SYS_clone3), "D"(ca), "S"(sizeof *ca), "r"(r12), "r"(r13)
			 : "rcx", "r11", "memory");
	return ret;
}
#endif

// fork_guest starts a guest in new user, mount, pid, net (unless the
// request brings one), ipc and uts namespaces with root mapped to
// uid_base, as the request asks. It returns the guest's pid and sets
// *pidfd, or returns -1 with msg and *err set.
static int fork_guest(const unsigned char *req, int *fds, int nfds, int *pidfd, char *msg, size_t len, int *err) {
	uint32_t uid_base, ids, flags;
	memcpy(&uid_base, req, 4);
	memcpy(&ids, req + 4, 4);
	memcpy(&flags, req + 8, 4);
	if (flags & ~(REQ_CGROUP | REQ_URGENT | REQ_NETNS))
		return fail(msg, len, err, EINVAL, "fork request has unknown flags %#x", flags);
	int need = FDS_BASE + !!(flags & REQ_CGROUP) + !!(flags & REQ_NETNS);
	if (nfds != need)
		return fail(msg, len, err, EINVAL, "fork request carries %d fds, want %d", nfds, need);
	if (ids == 0)
		return fail(msg, len, err, EINVAL, "fork request maps no ids");

	struct child_args a = {.go = -1, .go_parent = -1, .status = -1};
	for (int i = 0; i < FDS_BASE; i++)
		a.fds[i] = fds[i];
	int gop[2] = {-1, -1}, stp[2] = {-1, -1};
	int piped = !pipe2(gop, O_CLOEXEC) && !pipe2(stp, O_CLOEXEC);
	if (piped) {
		gop[0] = high(gop[0]);
		stp[1] = high(stp[1]);
	}
	if (!piped || gop[0] < 0 || stp[1] < 0) {
		fail(msg, len, err, errno, "starting guest: pipe");
		for (int i = 0; i < 2; i++)
			close(gop[i]), close(stp[i]);
		return -1;
	}
	a.go = gop[0];
	a.go_parent = gop[1];
	a.status = stp[1];

	// A child inherits the nice value and the namespaces of the thread
	// that forks it.
	int netns_entered = 0;
	if (flags & REQ_URGENT)
		setpriority(PRIO_PROCESS, 0, 0);
	int ret = -1;
	pid_t pid = -1;
	*pidfd = -1;
	if (flags & REQ_NETNS) {
		if (setns(fds[nfds - 1], CLONE_NEWNET)) {
			fail(msg, len, err, errno, "entering the guest's network namespace");
			goto out;
		}
		netns_entered = 1;
	}
	struct clone_args ca;
	memset(&ca, 0, sizeof ca);
	ca.flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD;
	if (!(flags & REQ_NETNS))
		ca.flags |= CLONE_NEWNET;
	if (flags & REQ_CGROUP) {
		ca.flags |= CLONE_INTO_CGROUP;
		ca.cgroup = (uint64_t)fds[FDS_BASE];
	}
	ca.pidfd = (uint64_t)(uintptr_t)pidfd;
	ca.exit_signal = SIGCHLD;
#if VM_CHILD
	ca.flags |= CLONE_VM;
	ca.stack = (uint64_t)(uintptr_t)(child_stack - CHILD_STACK);
	ca.stack_size = CHILD_STACK;
	long r = clone_vm(&ca, child, &a);
	// The child is done with its stack (and a) once the status pipe
	// closes below: at its exec, after the kernel has left this memory
	// for the guest's, or at its exit.
	if (r < 0)
		errno = (int)-r;
	pid = r < 0 ? -1 : (pid_t)r;
#else
	pid = (pid_t)syscall(SYS_clone3, &ca, sizeof ca);
	if (pid == 0)
		child(&a); // never returns
#endif
	if (pid < 0) {
		fail(msg, len, err, errno, "starting guest: clone3");
		goto out;
	}
	close(gop[0]);
	gop[0] = -1;
	close(stp[1]);
	stp[1] = -1;
	char map[64];
	snprintf(map, sizeof map, "0 %u %u\n", uid_base, ids);
	if (write_file(pid, "uid_map", map) || write_file(pid, "setgroups", "allow") || write_file(pid, "gid_map", map)) {
		fail(msg, len, err, errno, "starting guest: writing its id maps");
		goto kill;
	}
	if (write(gop[1], "g", 1) != 1) {
		fail(msg, len, err, errno, "starting guest: waking it");
		goto kill;
	}
	// The status pipe closes at the exec; before it, the child reports
	// what failed.
	unsigned char rep[4 + 61];
	ssize_t n;
	do
		n = read(stp[0], rep, sizeof rep - 1);
	while (n < 0 && errno == EINTR);
	if (n == 0) {
		ret = pid;
		goto out;
	}
	if (n >= 4) {
		int e;
		memcpy(&e, rep, 4);
		rep[n] = 0;
		fail(msg, len, err, e, "starting guest: %s", (char *)rep + 4);
	} else {
		fail(msg, len, err, n < 0 ? errno : EIO, "starting guest: reading its status");
	}
kill:
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	close(*pidfd);
	*pidfd = -1;
out:
	if (netns_entered && setns(own_netns, CLONE_NEWNET))
		broken = 1; // later guests would start in this one: stop
	if (flags & REQ_URGENT)
		setpriority(PRIO_PROCESS, 0, NICE);
	for (int i = 0; i < 2; i++) {
		if (gop[i] >= 0)
			close(gop[i]);
		if (stp[i] >= 0)
			close(stp[i]);
	}
	return ret;
}

// reap reaps every guest that has exited.
static void reap(void) {
	for (;;) {
		pid_t p = waitpid(-1, NULL, WNOHANG);
		if (p > 0 || (p < 0 && errno == EINTR))
			continue;
		return;
	}
}

// serve answers fork requests on FD_SOCKET until the daemon closes it,
// reaping the guests it forked as they exit.
static void serve(int sigfd) {
	unsigned char buf[256];
	char cbuf[CMSG_SPACE(FDS_MAX * sizeof(int))];
	for (;;) {
		struct pollfd p[2] = {{.fd = FD_SOCKET, .events = POLLIN}, {.fd = sigfd, .events = POLLIN}};
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			die("poll");
		}
		if (p[1].revents) {
			struct signalfd_siginfo si;
			while (read(sigfd, &si, sizeof si) > 0)
				;
			reap();
		}
		if (!p[0].revents)
			continue;
		struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
		ssize_t n = recvmsg(FD_SOCKET, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("reading a request");
		if (n == 0)
			_exit(0); // the daemon is gone
		int fds[FDS_MAX], nfds = 0, overflow = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			int k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (int i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
				if (nfds < FDS_MAX)
					fds[nfds++] = high(fd);
				else
					close(fd), overflow = 1;
			}
		}
		char msg[200] = "";
		int err = 0, pidfd = -1;
		int pid;
		if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC) || overflow)
			pid = fail(msg, sizeof msg, &err, EINVAL, "fork request too long");
		else if (n != REQ_LEN)
			pid = fail(msg, sizeof msg, &err, EINVAL, "fork request is %zd bytes, want %d", n, REQ_LEN);
		else
			pid = fork_guest(buf, fds, nfds, &pidfd, msg, sizeof msg, &err);
		for (int i = 0; i < nfds; i++)
			close(fds[i]);

		unsigned char rep[8 + sizeof msg];
		int32_t p32 = pid, e32 = err;
		memcpy(rep, &p32, 4);
		memcpy(rep + 4, &e32, 4);
		size_t mlen = pid < 0 ? strlen(msg) : 0;
		memcpy(rep + 8, msg, mlen);
		struct iovec riov = {.iov_base = rep, .iov_len = 8 + mlen};
		char rbuf[CMSG_SPACE(sizeof(int))];
		struct msghdr rmh = {.msg_iov = &riov, .msg_iovlen = 1};
		if (pidfd >= 0) {
			memset(rbuf, 0, sizeof rbuf);
			rmh.msg_control = rbuf;
			rmh.msg_controllen = sizeof rbuf;
			struct cmsghdr *c = CMSG_FIRSTHDR(&rmh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &pidfd, sizeof pidfd);
		}
		ssize_t w;
		do
			w = sendmsg(FD_SOCKET, &rmh, MSG_NOSIGNAL);
		while (w < 0 && errno == EINTR);
		if (pidfd >= 0)
			close(pidfd);
		if (w < 0)
			_exit(1);
		if (broken) {
			errno = EINVAL;
			die("returning to the forker's network namespace");
		}
	}
}

// load_base installs the sandboxes' base seccomp filter, a program the
// daemon wrote into FD_SECCOMP (internal/seccomp, split_linux.go), on the
// forker: every guest it forks inherits it, and loads only the filter's
// short tail once its set-up is done, where converting and compiling the
// whole program for each guest cost 8% of the guest's CPU. The forker holds
// CAP_SYS_ADMIN, so it needs no no_new_privs (a guest sets its own).
static void load_base(void) {
	struct stat st;
	if (fstat(FD_SECCOMP, &st))
		die("the seccomp filter's descriptor");
	size_t n = (size_t)st.st_size / sizeof(struct sock_filter);
	if (st.st_size <= 0 || (size_t)st.st_size % sizeof(struct sock_filter) || n > BPF_MAXINSNS) {
		errno = EINVAL;
		die("the seccomp filter's size");
	}
	struct sock_filter *insns = malloc((size_t)st.st_size);
	if (!insns)
		die("the seccomp filter's memory");
	if (pread(FD_SECCOMP, insns, (size_t)st.st_size, 0) != st.st_size)
		die("reading the seccomp filter");
	struct sock_fprog prog = {.len = (unsigned short)n, .filter = insns};
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog))
		die("loading the seccomp filter");
	free(insns);
	close(FD_SECCOMP);
}

// forker_main is the forker: argv[2:] are the devices guests bind
// (guestapi.Devices).
static void forker_main(int argc, char **argv) {
	// Signals the daemon's runtime handled are default again after exec;
	// ignored ones would stay ignored in every guest and every process
	// of its sandbox (the Go runtime leaves an ignored 32 and 33 as it
	// finds them). The system call, not signal(3): the C library refuses
	// the two signals it reserves. All zeros is SIG_DFL with no flags and
	// an empty mask in every architecture's layout.
	for (int s = 1; s < NSIG; s++) {
		unsigned long dfl[4] = {0};
		if (s != SIGKILL && s != SIGSTOP && syscall(SYS_rt_sigaction, s, dfl, NULL, 8))
			die("resetting a signal");
	}
	// SIGCHLD is read from a signalfd; SIGPIPE (a child that died before
	// it was woken) stays pending, so that the write fails with EPIPE
	// instead of killing the forker. A child's mask is emptied before
	// its exec, and it starts with nothing pending.
	sigset_t chld, blocked;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	blocked = chld;
	sigaddset(&blocked, SIGPIPE);
	if (sigprocmask(SIG_BLOCK, &blocked, NULL))
		die("blocking SIGCHLD and SIGPIPE");
	int sigfd = high(signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK));
	if (sigfd < 0)
		die("signalfd");
	if (fcntl(FD_SOCKET, F_SETFD, FD_CLOEXEC))
		die("the daemon's socket");
	// The guest binary moves out of the way of a guest's descriptors
	// (0-5); fd 4 stays open (close-on-exec) so that no descriptor the
	// forker opens later lands there.
	exe_fd = fcntl(FD_EXE, F_DUPFD_CLOEXEC, 64);
	if (exe_fd < 0 || fcntl(FD_EXE, F_SETFD, FD_CLOEXEC))
		die("the guest binary's descriptor");
	if (fcntl(FD_FAST, F_GETFD) >= 0) {
		fast_fd = fcntl(FD_FAST, F_DUPFD_CLOEXEC, 64);
		if (fast_fd < 0 || fcntl(FD_FAST, F_SETFD, FD_CLOEXEC))
			die("the fast guest's descriptor");
	}
	// Before anything else opens a descriptor (which could land on an
	// absent FD_SECCOMP): the forker's own set-up below passes the base
	// filter too.
	if (fcntl(FD_SECCOMP, F_GETFD) >= 0)
		load_base();
#if VM_CHILD
	char *stk = mmap(NULL, CHILD_STACK + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (stk == MAP_FAILED || mprotect(stk, 4096, PROT_NONE))
		die("the child's stack");
	child_stack = stk + 4096 + CHILD_STACK;
#endif
	own_netns = high(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
	if (own_netns < 0)
		die("opening the forker's network namespace");
	int ndevices = argc - 2;
	if (ndevices > MAX_DEVICES) {
		errno = E2BIG;
		die("devices");
	}
	isolate_mounts(argv + 2, ndevices);
	if (setpriority(PRIO_PROCESS, 0, NICE))
		die("lowering the forker's priority");
	serve(sigfd);
}

// The constructor runs before the Go runtime starts (glibc passes every
// constructor the program's arguments); a process whose first argument is
// not the forker's verb goes on to Go's main untouched.
__attribute__((constructor)) static void paddock_forker(int argc, char **argv, char **envp) {
	(void)envp;
	if (argc >= 2 && argv && argv[1] && strcmp(argv[1], FORKER_VERB) == 0) {
		forker_main(argc, argv);
		_exit(0);
	}
}
