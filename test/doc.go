// Package test holds paddock's end-to-end tests: they build (or take, from
// $PADDOCK_BIN) the real binary, start real daemons on private state and
// run directories, and drive them through the CLI and the Go SDK. They need
// root and skip without it.
package test
