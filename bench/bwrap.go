package main

// bwrapArgv is bubblewrap running cmd in a sandbox comparable to a paddock
// sandbox on the host image: every namespace bwrap can unshare (user, pid,
// net, ipc, uts, cgroup, mount), the host's /usr read-only with the usual
// symlinks, a fresh /proc, a minimal /dev and a private /tmp.
func bwrapArgv(bwrap string, cmd ...string) []string {
	argv := []string{bwrap,
		"--unshare-all",
		"--die-with-parent",
		"--ro-bind", "/usr", "/usr",
		"--symlink", "usr/bin", "/bin",
		"--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64",
		"--symlink", "usr/sbin", "/sbin",
		"--proc", "/proc",
		"--dev", "/dev",
		"--tmpfs", "/tmp",
		"--",
	}
	return append(argv, cmd...)
}
