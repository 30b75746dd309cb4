// Package guest is the PID 1 side of a sandbox (`paddock guest`): it
// assembles the root filesystem from the descriptors the daemon sends,
// drops privileges (capabilities, seccomp, no_new_privs), and serves the
// control socket: the process table with its PTYs and output rings, file
// ops resolved under the sandbox's root, port connects on its loopback,
// and the exec lanes bound to the sandbox that the daemon hands it.
//
// It speaks the protocol of internal/guestapi, whose Client is the
// daemon's only way in; no daemon package imports this one
// (guestapi's TestDaemonImportsNoGuest checks).
package guest
