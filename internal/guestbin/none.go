//go:build !embedguest

package guestbin

var binary, fast []byte
