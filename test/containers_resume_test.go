package test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// dependsYAML: db serves 1.5 s after it starts (or never, once
// /var/broken is on its disk); app's command needs it at once, and exits
// 9 (not restarted) when it cannot reach it.
const dependsYAML = `
containers:
  - name: db
    command: [sh, -c, "test -e /var/broken && exec sleep 86400; sleep 1.5; exec python3 -m http.server 7001 --bind 127.0.0.1 --directory /var"]
    readiness: {http: "7001/", timeout_seconds: 8}
  - name: app
    depends_on: [db]
    command: [sh, -c, "python3 -c \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:7001/', timeout=3)\" || exit 9; exec sleep 86400"]
`

// TestContainerReadinessOnResume: app starts once db is ready, at the
// create and at every resume (after a daemon restart too), and a resume
// answers only once db's check passes; a check that fails on a resume
// stops the sandbox again, paused as it was, naming the container and
// its check.
func TestContainerReadinessOnResume(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	spec := filepath.Join(d.Root, "sandbox.yaml")
	if err := os.WriteFile(spec, []byte(dependsYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	id := d.createCLI("-f", spec)
	// Started and ready: db answers at once, and app, started after it
	// was ready, reached it and runs.
	started := func(when string) {
		t.Helper()
		if out := d.groupExec(id, "app", "python3", "-c", "import urllib.request;urllib.request.urlopen('http://127.0.0.1:7001/', timeout=2)"); out.ExitCode != 0 {
			t.Fatalf("%s: db was not ready when the call answered: %s", when, out)
		}
		time.Sleep(time.Second) // app's own request has had its time
		sb := d.get(id)
		if sb.State != api.StateRunning {
			t.Fatalf("%s: sandbox %s", when, sb.State)
		}
		if app := sb.Containers[1]; app.State != api.StateRunning || app.PID == 0 || app.Exit != nil {
			t.Fatalf("%s: app did not start after db was ready: %+v exit %+v lines %q", when, app.State, app.Exit, app.LastLines)
		}
	}
	started("create")

	d.MustCLI("pause", id)
	d.MustCLI("resume", id)
	started("resume")

	d.MustCLI("pause", id)
	d.Stop()
	d.Start()
	d.MustCLI("resume", id)
	started("resume after a daemon restart")

	// db will never serve again: the resume fails, naming it and its
	// check, and leaves the sandbox paused with why.
	d.groupExec(id, "db", "touch", "/var/broken")
	d.MustCLI("pause", id)
	r := d.CLI("resume", id)
	if r.Code == 0 || !strings.Contains(r.Stderr, "container db") || !strings.Contains(r.Stderr, "GET localhost:7001/") {
		t.Fatalf("resume with db never ready: %+v", r)
	}
	sb := d.get(id)
	if sb.State != api.StatePaused || !strings.Contains(sb.Error, "container db is not ready") {
		t.Fatalf("after a failed resume: state %s, error %q", sb.State, sb.Error)
	}
	for _, c := range sb.Containers {
		if c.State != api.StatePaused || c.PID != 0 {
			t.Errorf("container %s after a failed resume: %s pid %d", c.Name, c.State, c.PID)
		}
	}

	// depends_on names containers listed before.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := d.Client().Create(ctx, api.CreateRequest{Containers: []api.Container{
		{Name: "app", DependsOn: []string{"db"}}, {Name: "db"},
	}})
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "depends_on") {
		t.Errorf("depends_on a container listed after: %v", err)
	}
}
