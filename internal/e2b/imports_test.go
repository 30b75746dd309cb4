package e2b

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestAdapterImports keeps the facade an adapter: it translates to the
// packages that own each behaviour and owns none of theirs. Cgroup
// counters come through the telemetry hub, records and secrets through
// the sandbox manager and the secret store, statuses through errdefs.
// The store is still reached through the sandbox manager, which keeps its
// records there; the facade must not use it itself.
func TestAdapterImports(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("skipping: no go tool in PATH")
	}
	list := func(args ...string) []string {
		t.Helper()
		out, err := exec.Command(goTool, append([]string{"list"}, args...)...).Output()
		if err != nil {
			t.Fatalf("go list %v: %v", args, err)
		}
		return strings.Fields(string(out))
	}
	const mod = "github.com/paddock-dev/paddock/"
	imports := list("-f", `{{join .Imports " "}}`, ".")
	deps := list("-deps", ".")
	for _, pkg := range []string{"internal/cgroup", "internal/store", "internal/server"} {
		if slices.Contains(imports, mod+pkg) {
			t.Errorf("internal/e2b imports %s", pkg)
		}
	}
	for _, pkg := range []string{"internal/cgroup", "internal/server"} {
		if slices.Contains(deps, mod+pkg) {
			t.Errorf("internal/e2b depends on %s (go list -deps)", pkg)
		}
	}
}
