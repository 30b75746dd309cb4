package exitprog

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestRuns runs the program and checks it exits 0.
func TestRuns(t *testing.T) {
	prog := ELF()
	if prog == nil {
		t.Skip("no program for this architecture")
	}
	path := filepath.Join(t.TempDir(), "exit")
	if err := os.WriteFile(path, prog, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(path).CombinedOutput(); err != nil {
		t.Fatalf("running it: %v (%q)", err, out)
	}
}
