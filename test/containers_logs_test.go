package test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// TestContainerLogs checks that the kept output of a sandbox of several
// containers names each process's container: each container numbers its
// own processes, so a pid alone does not say whose output it is.
func TestContainerLogs(t *testing.T) {
	d := newDaemon(t)
	spec := filepath.Join(d.Root, "sandbox.yaml")
	const yaml = `
containers:
  - name: main
  - name: tools
    image: base
`
	if err := os.WriteFile(spec, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	id := d.createCLI("-f", spec)
	// Several commands in each, so that their pids are likely to meet.
	for i := 0; i < 3; i++ {
		d.groupExec(id, "main", "echo", "from-main")
		d.groupExec(id, "tools", "echo", "from-tools")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := d.Client()
	var all []api.ExecLog
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool {
		var err error
		all, err = c.Logs(ctx, id)
		return err == nil && len(all) == 6 && !slices.ContainsFunc(all, func(l api.ExecLog) bool { return l.Exit == nil })
	}) {
		t.Fatalf("logs of %s: %+v, want 6 ended processes", id, all)
	}
	for _, l := range all {
		want := map[string]string{"": "from-main", "tools": "from-tools"}[l.Container]
		if want == "" || l.Cmd[1] != want {
			t.Fatalf("process %d is listed in container %q running %q", l.PID, l.Container, l.Cmd)
		}
		// Its output, asked in its own container (the first by its
		// name or by default), is its own.
		names := []string{l.Container}
		if l.Container == "" {
			names = append(names, "main")
		}
		for _, name := range names {
			s, err := c.Log(client.WithContainer(ctx, name), id, l.PID, client.LogOptions{})
			if err != nil {
				t.Fatalf("log of %d in %q: %v", l.PID, name, err)
			}
			var out strings.Builder
			_, err = s.Wait(&out, &out)
			s.Close()
			if err != nil || out.String() != want+"\n" {
				t.Fatalf("log of %d in %q = %q, %v; want %q", l.PID, name, out.String(), err, want)
			}
		}
	}
	tools, err := c.Logs(client.WithContainer(ctx, "tools"), id)
	if err != nil || len(tools) != 3 || slices.ContainsFunc(tools, func(l api.ExecLog) bool { return l.Container != "tools" }) {
		t.Fatalf("logs -c tools = %+v, %v; want tools' 3", tools, err)
	}
	first, err := c.Logs(client.WithContainer(ctx, "main"), id)
	if err != nil || len(first) != 3 || slices.ContainsFunc(first, func(l api.ExecLog) bool { return l.Container != "" }) {
		t.Fatalf("logs -c main = %+v, %v; want main's 3", first, err)
	}
	if out := d.MustCLI("logs", id); !strings.Contains(out, "CONTAINER") || !strings.Contains(out, "tools") {
		t.Fatalf("paddock logs of a group names no containers:\n%s", out)
	}
	if r := d.CLI("logs", "-c", "nope", id); r.Code == 0 {
		t.Fatalf("logs of an unknown container: %+v", r)
	}
}
