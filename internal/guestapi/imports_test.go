package guestapi

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// guestPkg is the PID 1 side of the guest.
const guestPkg = "github.com/paddock-dev/paddock/internal/guest"

// mayImportGuest are the packages that may depend on the PID 1 side: the
// guest itself, the dispatcher of the guest binary's verbs and the two
// mains that call it.
var mayImportGuest = map[string]bool{
	guestPkg: true,
	"github.com/paddock-dev/paddock/internal/guestmain": true,
	"github.com/paddock-dev/paddock/cmd/paddock":        true,
	"github.com/paddock-dev/paddock/cmd/paddock-guest":  true,
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

// TestNoRawRequestsOutsideGuest: outside the guest and this package no
// code builds a Request, reads a Response or names an op; it calls the
// Client's methods, so that a change of an op touches only the two sides
// of the protocol.
func TestNoRawRequestsOutsideGuest(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	raw := func(name string) bool {
		return name == "Request" || name == "Response" || strings.HasPrefix(name, "Op")
	}
	checked := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			switch rel {
			case filepath.Join("internal", "guest"), filepath.Join("internal", "guestapi"), ".git":
				return filepath.SkipDir
			}
			if strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		local := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"github.com/paddock-dev/paddock/internal/guestapi"` {
				local = "guestapi"
				if imp.Name != nil {
					local = imp.Name.Name
				}
			}
		}
		if local == "" {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == local && raw(sel.Sel.Name) {
					t.Errorf("%s uses %s.%s: call the Client's method for it", rel, local, sel.Sel.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("read %d Go files under %s; want the whole module", checked, root)
	}
}
