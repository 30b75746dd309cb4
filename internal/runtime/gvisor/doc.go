// Package gvisor is the gvisor isolation tier: each sandbox's guest runs
// as PID 1 inside gVisor (runsc, systrap platform), whose kernel in user
// space (the sentry) stands between the sandbox and the host's, so that a
// kernel bug reachable from the sandbox is not a host compromise.
//
// What it shares with the native tier: the disk (a size-capped ext4
// image, the overlay's upper layer), the image layers (overlaid on the
// host into the OCI bundle's root), the cgroup (runsc's processes run in
// it: limits, freeze, stats), the network slot (runsc's netstack runs in
// the namespace the gateway made, so the proxy and its nftables rules
// apply unchanged) and the guest, which serves exec, PTYs, files, ports
// and lanes on a control socket the daemon dials.
//
// runsc runs as root: it then confines the sentry and its gofer in fresh
// user, mount, pid and IPC namespaces, chroots them, drops every
// capability and installs its own seccomp filters (runsc's documented
// production setup). Rootless runsc cannot join a network namespace the
// host's user namespace owns, and leaves out those confinements.
package gvisor
