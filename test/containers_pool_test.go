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
	"github.com/paddock-dev/paddock/examples/postgres"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// warmReady is how many groups template name's pool holds ready.
func (d *Daemon) warmReady(name string) int {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := d.Client().Pools(ctx)
	if err != nil {
		d.t.Fatalf("pools: %v", err)
	}
	return p.Ready["template:"+name]
}

// awaitWarm waits until template name's pool holds n ready groups.
func (d *Daemon) awaitWarm(name string, n int) {
	d.t.Helper()
	if !waitFor(3*time.Minute, 100*time.Millisecond, func() bool { return d.warmReady(name) == n }) {
		d.t.Fatalf("template %s: %d groups ready, want %d\n%s", name, d.warmReady(name), n, d.Log())
	}
}

// TestContainersPostgresPool makes the postgres example a group template
// with a warm pool: a create from it is a hand-out of a group whose
// postgres is up (psql from the harness works at once), the pool refills,
// a restarted daemon adopts the groups, and removing the template leaves
// nothing behind. What a create cannot change on a started group is
// refused.
func TestContainersPostgresPool(t *testing.T) {
	if _, err := os.Stat(postgres.Server); err != nil {
		t.Skip("needs Debian's postgresql (apt-get install postgresql)")
	}
	t.Parallel()
	d := newDaemon(t)
	c := d.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The sandbox.yaml as written is a template's spec once named.
	if out := d.MustCLI("template", "build", "-q", "-f", postgresExample, "--name", "pg"); strings.TrimSpace(out) != "pg" {
		t.Fatalf("template build printed %q", out)
	}
	d.MustCLI("pool", "set", "template:pg", "2")
	d.awaitWarm("pg", 2)
	if list, err := c.List(ctx, client.ListOptions{}); err != nil || len(list) != 0 {
		t.Fatalf("the pool's groups are listed: %v %v", list, err)
	}

	// Bad input: each refused with the field named, the pool untouched.
	bad := []struct {
		req  api.CreateRequest
		want string
	}{
		{api.CreateRequest{From: "pg", Env: map[string]string{"A": "1"}}, "env"},
		{api.CreateRequest{From: "pg", Resources: api.Resources{MemoryBytes: 1 << 30}}, "resources"},
		{api.CreateRequest{From: "pg", Workdir: "/tmp"}, "workdir"},
		{api.CreateRequest{From: "pg", Image: "base"}, "image"},
		{api.CreateRequest{From: "pg", Containers: []api.Container{{Name: "x"}}}, "from"},
	}
	for _, b := range bad {
		_, err := c.Create(ctx, b.req)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), b.want) {
			t.Errorf("create %+v: %v, want invalid naming %s", b.req, err, b.want)
		}
	}
	badSpecs := []api.TemplateSpec{
		{Name: "bad1", Containers: []api.Container{{Name: "a"}}, Steps: []api.TemplateStep{{Run: "true"}}},
		{Name: "bad2", Containers: []api.Container{{Name: "a", Image: "no-such-image"}}},
		{Name: "bad3", Image: "base", Containers: []api.Container{{Name: "a"}}},
		{Name: "bad4", Containers: []api.Container{{Name: "a"}, {Name: "a"}}},
		{Name: "bad5", Steps: []api.TemplateStep{{Run: "true"}}, SharedVolumes: []api.SharedVolume{{Name: "w"}}},
	}
	for _, s := range badSpecs {
		if _, err := c.BuildTemplate(ctx, s, func(api.TemplateEvent) {}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("template %s: %v, want invalid", s.Name, err)
		}
	}
	if n := d.warmReady("pg"); n != 2 {
		t.Fatalf("refused creates took groups: %d ready", n)
	}

	// A hand-out: every container running, postgres ready at once.
	id := d.createCLI("--from", "pg", "--label", "who=test", "--timeout", "10m")
	sb := d.get(id)
	if !sb.Pooled || sb.From != "pg" || sb.Labels["who"] != "test" || sb.ExpiresAt == nil {
		t.Fatalf("handed-out sandbox: pooled %v from %q labels %v expires %v", sb.Pooled, sb.From, sb.Labels, sb.ExpiresAt)
	}
	for _, ct := range sb.Containers {
		if ct.State != api.StateRunning {
			t.Fatalf("container %s is %s: %s", ct.Name, ct.State, ct.Error)
		}
	}
	if v := d.psql(id, "harness", "show server_version"); !strings.HasPrefix(v, "15") {
		t.Fatalf("postgres's version %q", v)
	}
	if h := strings.TrimSpace(d.groupExec(id, "harness", "hostname").Stdout); h != id {
		t.Fatalf("hostname %q, want the sandbox's id %s", h, id)
	}
	if list, err := c.List(ctx, client.ListOptions{}); err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("list after a hand-out: %v %v", list, err)
	}
	d.awaitWarm("pg", 2) // refilled behind

	// A restarted daemon adopts the pool's groups and makes none anew.
	d.Stop()
	d.Start()
	if n := d.warmReady("pg"); n != 2 {
		t.Fatalf("after a restart: %d groups ready, want 2 adopted\n%s", n, d.Log())
	}
	if got := strings.Count(d.Log(), "pooled group adopted"); got != 2 {
		t.Fatalf("%d groups adopted, want 2\n%s", got, d.Log())
	}
	if v := d.psql(id, "harness", "select 1"); v != "1" {
		t.Fatalf("the handed-out sandbox after a restart: %q", v)
	}
	c = d.Client()
	id2 := d.createCLI("--from", "pg")
	if sb := d.get(id2); !sb.Pooled {
		t.Fatal("the create after a restart was not a hand-out")
	}
	if v := d.psql(id2, "harness", "select 2"); v != "2" {
		t.Fatalf("an adopted group's postgres: %q", v)
	}

	// Removing the template drains its pool; with its sandboxes gone,
	// nothing of it is left (the cleanup checks mounts and processes).
	d.MustCLI("template", "rm", "pg")
	if p, err := c.Pools(ctx); err != nil || p.Target["template:pg"] != 0 || p.Ready["template:pg"] != 0 {
		t.Fatalf("pools after the template's removal: %+v %v", p, err)
	}
	d.MustCLI("rm", "-f", id, id2)
	// A group's containers have cgroups inside its own (the warm and
	// blank guests of the runtime's pools, beside, have none).
	cgroups := func() []string {
		var left []string
		for _, ctrl := range []string{"memory", "unified", ""} {
			dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", ctrl, d.Cgroup, "*", "*"))
			for _, dir := range dirs {
				if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
					left = append(left, dir)
				}
			}
		}
		return left
	}
	if !waitFor(time.Minute, 100*time.Millisecond, func() bool { return len(cgroups()) == 0 }) {
		t.Fatalf("left behind: %v", cgroups())
	}
	vols, err := c.Volumes(ctx)
	if err != nil || len(vols) != 0 {
		t.Fatalf("volumes left: %v %v", vols, err)
	}
}
