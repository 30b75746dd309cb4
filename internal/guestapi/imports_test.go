package guestapi

import (
	"os/exec"
	"strings"
	"testing"
)

// guestPkg is the PID 1 side of the guest.
const guestPkg = "github.com/paddock-dev/paddock/internal/guest"

// mayImportGuest are the packages that may depend on the PID 1 side: the
// guest itself and the binary's main, which dispatches to it.
var mayImportGuest = map[string]bool{
	guestPkg: true,
	"github.com/paddock-dev/paddock/cmd/paddock": true,
}

// TestDaemonImportsNoGuest: no package of the module but the guest and
// main depends on the guest's PID 1 side; the daemon reaches a guest
// through this package only.
func TestDaemonImportsNoGuest(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("finding the go command: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-test=false", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "github.com/paddock-dev/paddock/...").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, " ")
		if !strings.HasPrefix(pkg, "github.com/paddock-dev/paddock/") || mayImportGuest[pkg] {
			continue
		}
		checked++
		for _, d := range strings.Fields(deps) {
			if d == guestPkg {
				t.Errorf("%s depends on %s, the guest's PID 1 side; use internal/guestapi", pkg, guestPkg)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("go list named %d packages of the module; want the whole module", checked)
	}
}
