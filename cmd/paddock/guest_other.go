//go:build !linux

package main

// runGuest: a client-only build runs no sandboxes, so it has no guest.
func runGuest(string) {}
