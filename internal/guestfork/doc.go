// Package guestfork is the host side of a guest's start that runs apart
// from the daemon: the forker (`guest-forker`), a small helper process
// that forks each guest (`guest`) into its fresh namespaces; the package
// internal/guestmain runs either verb. Both verbs come from the same binary: the slim
// paddock-guest the daemon embeds (internal/guestbin), or the paddock
// binary itself in a build that embeds none.
//
// The daemon's end of the forker (starting it, sending it requests) is in
// internal/runtime/native; this package keeps the guest binary free of
// the daemon's packages.
package guestfork
