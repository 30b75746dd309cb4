// Package guestmain runs the guest binary's hidden verb: the guest, PID 1
// of a sandbox (internal/guest). Only the binaries' mains import it, so no
// package of the daemon links the guest's PID 1 side.
package guestmain

import (
	"fmt"
	"os"
	"strconv"

	"github.com/paddock-dev/paddock/internal/guest"
	"github.com/paddock-dev/paddock/internal/guestfork"
)

// Main runs verb if it is the guest binary's and exits; any other verb
// returns.
func Main(verb string) {
	if verb == guestfork.GuestVerb {
		err := guest.Run()
		fmt.Fprintln(os.Stderr, "paddock guest:", err)
		os.Exit(1)
	}
	if verb == guestfork.AdoptVerb && len(os.Args) > 2 {
		fd, err := strconv.Atoi(os.Args[2])
		if err == nil {
			err = guest.Adopt(fd)
		}
		fmt.Fprintln(os.Stderr, "paddock guest (adopting):", err)
		os.Exit(1)
	}
	if verb == guestfork.HelperVerb && len(os.Args) > 2 {
		// Its socket to the fast guest is fd 3 (internal/guestc).
		if err := guest.Helper(3, os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "paddock guest (helper):", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}
