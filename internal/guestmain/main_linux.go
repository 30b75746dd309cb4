// Package guestmain runs the guest binary's hidden verbs: the guest
// (PID 1 of a sandbox, internal/guest) and the forker that starts guests
// (internal/guestfork). Only the binaries' mains import it, so no package
// of the daemon links the guest's PID 1 side.
package guestmain

import (
	"fmt"
	"os"

	"github.com/paddock-dev/paddock/internal/guest"
	"github.com/paddock-dev/paddock/internal/guestfork"
)

// Main runs verb if it is one of the guest binary's and exits; any other
// verb returns.
func Main(verb string) {
	switch verb {
	case guestfork.GuestVerb:
		err := guest.Run()
		fmt.Fprintln(os.Stderr, "paddock guest:", err)
		os.Exit(1)
	case guestfork.ForkerVerb:
		if err := guestfork.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "paddock guest-forker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}
