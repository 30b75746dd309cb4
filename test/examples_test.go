package test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestQuickstartExample runs the SDK's example program against a real
// daemon, so that the documented example keeps working.
func TestQuickstartExample(t *testing.T) {
	d := StartDaemon(t)
	cmd := exec.Command("go", "run", "../examples/quickstart")
	cmd.Env = append(os.Environ(), "PADDOCK_HOST="+d.Host)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("quickstart: %v\n%s", err, out)
	}
	for _, want := range []string{"exit code 3", "tick 3", "client.ErrNotFound", "Python 3"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("quickstart output lacks %q:\n%s", want, out)
		}
	}
}
