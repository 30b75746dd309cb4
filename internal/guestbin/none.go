//go:build !embedguest

package guestbin

var binary []byte
