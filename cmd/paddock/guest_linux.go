package main

import (
	"fmt"
	"os"

	"github.com/paddock-dev/paddock/internal/guest"
	"github.com/paddock-dev/paddock/internal/runtime/native"
)

// runGuest runs the hidden verbs a sandbox's start execs (the guest, PID
// 1, and the warm guests' forker) and exits; any other verb returns.
func runGuest(verb string) {
	switch verb {
	case "guest":
		err := guest.Run()
		fmt.Fprintln(os.Stderr, "paddock guest:", err)
		os.Exit(1)
	case "guest-forker":
		if err := native.RunForker(); err != nil {
			fmt.Fprintln(os.Stderr, "paddock guest-forker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}
