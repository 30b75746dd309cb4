package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

const templateSpec = `name: web
resources:
  memory_bytes: 268435456
steps:
  - run: echo step-one > /opt/one && echo built-one
  - copy: {src: app, dest: /srv/app}
  - copy: {src: notes.txt, dest: /etc/notes/}
  - env: {GREETING: hello, MODE: "3"}
  - workdir: /srv/app
  - run: echo "$GREETING from $(pwd)" > result.txt
`

// writeTemplateDir writes a build context: paddock.yaml (spec), app/ and
// notes.txt.
func writeTemplateDir(t *testing.T, spec string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"paddock.yaml":   spec,
		"app/main.sh":    "#!/bin/sh\necho main\n",
		"app/sub/x.txt":  "x\n",
		"notes.txt":      "remember\n",
		"unused/big.bin": strings.Repeat("u", 1<<16),
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "app/main.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestTemplateBuildCache: a template built from paddock.yaml with run,
// copy, env and workdir steps; a sandbox made from it sees every step's
// result; each step is a snapshot the template holds; a rebuild reuses
// the steps before the first change and runs the rest; rm removes the
// snapshots no template holds, while sandboxes made from it keep working.
func TestTemplateBuildCache(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	dir := writeTemplateDir(t, templateSpec)

	r := d.CLI("template", "build", dir)
	if r.Code != 0 {
		t.Fatalf("template build: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	if !strings.Contains(r.Stdout, "built-one\n") || !strings.HasSuffix(r.Stdout, "web\n") {
		t.Fatalf("build stdout %q: want the run step's output, then the name", r.Stdout)
	}
	if !strings.Contains(r.Stderr, "step 1/6: run echo step-one") || strings.Contains(r.Stderr, "(cached)") {
		t.Fatalf("first build's log: %q", r.Stderr)
	}
	first, err := c.GetTemplate(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	if first.CacheHits != 0 || first.CacheMisses != 6 || len(first.Steps) != 6 || first.Workdir != "/srv/app" || first.Env["GREETING"] != "hello" {
		t.Fatalf("first build: %+v", first)
	}

	// A sandbox from the template sees every step.
	id := d.createCLI("--from", "web")
	got := d.Sh(id, `cat /opt/one /srv/app/sub/x.txt /etc/notes/notes.txt result.txt; /srv/app/main.sh; pwd; echo "$GREETING $MODE"; test -e /srv/app/../unused && echo leak || true`)
	want := "step-one\nx\nremember\nhello from /srv/app\nmain\n/srv/app\nhello 3\n"
	if got != want {
		t.Fatalf("sandbox from template sees %q, want %q", got, want)
	}
	sb := d.get(id)
	if sb.From != "web" || sb.Resources.MemoryBytes != 256<<20 {
		t.Fatalf("sandbox from template: from %q, resources %+v", sb.From, sb.Resources)
	}

	// Each step's snapshot is held by the template.
	for _, s := range first.Steps {
		if err := c.DeleteSnapshot(ctx, s.Snapshot); !errors.Is(err, client.ErrConflict) || !strings.Contains(err.Error(), "template:web") {
			t.Fatalf("removing step snapshot %s: %v", s.Snapshot, err)
		}
	}

	// Holds live in memory: a restarted daemon takes them again.
	d.Kill9()
	d.Start()
	c = d.Client()
	if err := c.DeleteSnapshot(ctx, first.Snapshot); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("removing the template's snapshot after a restart: %v", err)
	}

	// Unchanged: every step is a hit, the snapshots are the same.
	r = d.CLI("template", "build", dir)
	if r.Code != 0 || strings.Count(r.Stderr, "(cached)") != 6 || strings.Contains(r.Stdout, "built-one") {
		t.Fatalf("unchanged rebuild: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	again, _ := c.GetTemplate(ctx, "web")
	if again.CacheHits != 6 || again.Snapshot != first.Snapshot {
		t.Fatalf("unchanged rebuild: hits %d, snapshot %s (was %s)", again.CacheHits, again.Snapshot, first.Snapshot)
	}

	// The last step changes: steps 1-5 hit, step 6 misses.
	os.WriteFile(filepath.Join(dir, "paddock.yaml"), []byte(strings.Replace(templateSpec, `echo "$GREETING from $(pwd)"`, `echo "$GREETING again"`, 1)), 0o644)
	r = d.CLI("template", "build", dir)
	if r.Code != 0 {
		t.Fatalf("rebuild: exit %d\n%s", r.Code, r.Stderr)
	}
	second, _ := c.GetTemplate(ctx, "web")
	if second.CacheHits != 5 || second.CacheMisses != 1 {
		t.Fatalf("rebuild after changing step 6: %d hits, %d misses\n%s", second.CacheHits, second.CacheMisses, r.Stderr)
	}
	for i := 0; i < 5; i++ {
		if second.Steps[i] != (api.TemplateStepResult{Key: first.Steps[i].Key, Snapshot: first.Steps[i].Snapshot, Cached: true}) {
			t.Fatalf("step %d: %+v, was %+v", i+1, second.Steps[i], first.Steps[i])
		}
	}
	if second.Steps[5].Cached || second.Steps[5].Snapshot == first.Steps[5].Snapshot || second.Steps[5].Key == first.Steps[5].Key {
		t.Fatalf("step 6 was not rebuilt: %+v", second.Steps[5])
	}
	// The replaced step's snapshot went with it.
	if _, err := c.GetSnapshot(ctx, first.Steps[5].Snapshot); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the replaced step's snapshot: %v", err)
	}
	// A copied file's content is part of its step's key: step 2 and all
	// after it miss.
	os.WriteFile(filepath.Join(dir, "app/sub/x.txt"), []byte("changed\n"), 0o644)
	r = d.CLI("template", "build", dir)
	third, _ := c.GetTemplate(ctx, "web")
	if r.Code != 0 || third.CacheHits != 1 || third.CacheMisses != 5 {
		t.Fatalf("rebuild after changing a copied file: exit %d, %d hits, %d misses\n%s", r.Code, third.CacheHits, third.CacheMisses, r.Stderr)
	}
	id2 := d.createCLI("--from", "web")
	if got := d.Sh(id2, "cat sub/x.txt result.txt"); got != "changed\nhello again\n" {
		t.Fatalf("sandbox from the rebuilt template sees %q", got)
	}
	// The sandbox made before is unchanged.
	if got := d.Sh(id, "cat sub/x.txt"); got != "x\n" {
		t.Fatalf("older sandbox sees %q", got)
	}

	// The template holds exactly its six steps' snapshots.
	snaps, _ := c.Snapshots(ctx, "")
	if len(snaps) != 6 {
		t.Fatalf("%d snapshots after three rebuilds, want the template's 6", len(snaps))
	}
	if list := d.MustCLI("template", "ls"); !strings.Contains(list, "web") || !strings.Contains(list, third.Snapshot) {
		t.Fatalf("template ls: %q", list)
	}
	d.MustCLI("template", "rm", "web")
	if snaps, _ := c.Snapshots(ctx, ""); len(snaps) != 0 {
		t.Fatalf("snapshots left after template rm: %d", len(snaps))
	}
	if _, err := c.GetTemplate(ctx, "web"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("removed template: %v", err)
	}
	if got := d.Sh(id2, "cat /opt/one"); got != "step-one\n" {
		t.Fatalf("sandbox after its template's removal sees %q", got)
	}
	if _, err := c.Create(ctx, api.CreateRequest{From: "web"}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("create from a removed template: %v", err)
	}
}

// TestTemplateBadSpecs: specs are refused with a 400 naming the field,
// before anything is built; a failing step ends the build with its error
// and leaves no snapshot behind.
func TestTemplateBadSpecs(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	run := func(s string) api.TemplateStep { return api.TemplateStep{Run: s} }
	content := "x"
	for _, tc := range []struct {
		spec  api.TemplateSpec
		field string
	}{
		{api.TemplateSpec{Name: "Bad Name", Steps: []api.TemplateStep{run("true")}}, "name"},
		{api.TemplateSpec{Name: "host", Steps: []api.TemplateStep{run("true")}}, "name"},
		{api.TemplateSpec{Name: "ok"}, "steps"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Run: "true", Workdir: "/x"}}}, "steps[0]"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Copy: &api.TemplateCopy{Src: "../etc/passwd", Dest: "/x"}}}}, "steps[0].copy.src"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Copy: &api.TemplateCopy{Content: &content, Dest: "rel"}}}}, "steps[0].copy.dest"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Copy: &api.TemplateCopy{Src: "nothere", Dest: "/x"}}}}, "copy.src"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Env: map[string]string{"1BAD": "x"}}}}, "steps[0].env"},
		{api.TemplateSpec{Name: "ok", Image: "nope", Steps: []api.TemplateStep{run("true")}}, "image"},
		{api.TemplateSpec{Name: "ok", Warm: 1000, Steps: []api.TemplateStep{run("true")}}, "warm"},
	} {
		_, err := c.BuildTemplate(ctx, tc.spec, nil)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != 400 || !strings.Contains(ce.Message, tc.field) {
			t.Errorf("spec %+v: %v, want a 400 naming %s", tc.spec, err, tc.field)
		}
	}
	// YAML with an unknown key.
	dir := writeTemplateDir(t, "name: y\nsteps:\n  - rn: true\n")
	if r := d.CLI("template", "build", dir); r.Code == 0 || !strings.Contains(r.Stderr, "rn: unknown field") {
		t.Fatalf("unknown key: exit %d, %s", r.Code, r.Stderr)
	}
	// A failing step: the build ends with its error, no snapshot stays.
	var log []api.TemplateEvent
	_, err := c.BuildTemplate(ctx, api.TemplateSpec{Name: "fails", Steps: []api.TemplateStep{
		{Copy: &api.TemplateCopy{Content: &content, Dest: "/opt/f"}}, run("echo oops >&2; exit 3"),
	}}, func(e api.TemplateEvent) { log = append(log, e) })
	if err == nil || !strings.Contains(err.Error(), "exited with code 3") {
		t.Fatalf("failing step: %v", err)
	}
	sawStderr := false
	for _, e := range log {
		sawStderr = sawStderr || (e.Stream == "stderr" && strings.Contains(e.Data, "oops"))
	}
	if !sawStderr {
		t.Fatalf("the failing step's stderr did not stream: %+v", log)
	}
	if snaps, _ := c.Snapshots(ctx, ""); len(snaps) != 0 {
		t.Fatalf("a failed build left %d snapshots", len(snaps))
	}
	if list, _ := c.List(ctx, client.ListOptions{}); len(list) != 0 {
		t.Fatalf("a failed build left %d sandboxes", len(list))
	}
	// A failed rebuild keeps the previous version, and its holds.
	steps := []api.TemplateStep{{Copy: &api.TemplateCopy{Content: &content, Dest: "/opt/f"}}, run("true")}
	kept, err := c.BuildTemplate(ctx, api.TemplateSpec{Name: "keep", Steps: steps}, nil)
	if err != nil {
		t.Fatal(err)
	}
	steps[1] = run("exit 3")
	if _, err := c.BuildTemplate(ctx, api.TemplateSpec{Name: "keep", Steps: steps}, nil); err == nil {
		t.Fatal("a failing rebuild succeeded")
	}
	now, err := c.GetTemplate(ctx, "keep")
	if err != nil || now.Snapshot != kept.Snapshot {
		t.Fatalf("after a failed rebuild: %+v, %v", now, err)
	}
	for _, st := range kept.Steps {
		if err := c.DeleteSnapshot(ctx, st.Snapshot); !errors.Is(err, client.ErrConflict) {
			t.Fatalf("removing a kept step's snapshot: %v", err)
		}
	}
	if snaps, _ := c.Snapshots(ctx, ""); len(snaps) != 2 {
		t.Fatalf("%d snapshots after a failed rebuild, want the 2 kept", len(snaps))
	}
}

// TestTemplateWarmPool: a template with warm: 2 keeps two sandboxes
// ready, frozen; a create from the template is a hand-out of one of them
// (its id is a warm guest's), sees the template's files, and the pool
// refills; the pool goes with the template.
func TestTemplateWarmPool(t *testing.T) {
	d := StartDaemon(t, "--warm-guests", "1")
	c := d.Client()
	ctx := context.Background()
	content := "pooled\n"
	tpl, err := c.BuildTemplate(ctx, api.TemplateSpec{Name: "pooled", Warm: 2, Steps: []api.TemplateStep{
		{Copy: &api.TemplateCopy{Content: &content, Dest: "/opt/p.txt"}},
		{Env: map[string]string{"POOL": "yes"}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Warm != 2 {
		t.Fatalf("template: %+v", tpl)
	}
	full := func() bool {
		p, err := c.Pools(ctx)
		return err == nil && p.Ready["template:pooled"] == 2 && p.Target["template:pooled"] == 2 && p.Ready["image:host"] == 1
	}
	if !waitFor(30*time.Second, 50*time.Millisecond, full) {
		p, _ := c.Pools(ctx)
		t.Fatalf("pools did not fill: %+v", p)
	}
	warm := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(d.RunDir, "warm"))
	for _, e := range ents {
		warm[e.Name()] = true
	}
	// Idle: a waiting guest uses no CPU (it blocks on its socket).
	for deadline := time.Now().Add(20 * time.Second); ; {
		busy := ""
		before := map[string]time.Duration{}
		for id := range warm {
			if before[id] = cpuUsage(d, id); before[id] <= 0 {
				t.Fatalf("no CPU usage read for warm guest %s", id)
			}
		}
		time.Sleep(time.Second)
		for id := range warm {
			if used := cpuUsage(d, id) - before[id]; used > 2*time.Millisecond {
				busy = fmt.Sprintf("warm guest %s used %s of CPU in 1 s while waiting", id, used)
			}
		}
		if busy == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(busy)
		}
	}
	if len(warm) != 3 {
		t.Fatalf("%d warm guests, want 3 (2 of the template, 1 of host)", len(warm))
	}
	sb, err := c.Create(ctx, api.CreateRequest{From: "pooled"})
	if err != nil {
		t.Fatal(err)
	}
	if !warm[sb.ID] {
		t.Fatalf("sandbox %s was not handed out of the pool %v\n%s", sb.ID, warm, d.Log())
	}
	// Thawed with its activation, just after the answer.
	thawed := func() bool { st := freezerState(d, sb.ID); return st == "THAWED" || st == "0" }
	if !waitFor(5*time.Second, 5*time.Millisecond, thawed) {
		t.Fatalf("handed-out sandbox: freezer state %q", freezerState(d, sb.ID))
	}
	if got := d.Sh(sb.ID, "cat /opt/p.txt; echo $POOL"); got != "pooled\nyes\n" {
		t.Fatalf("handed-out sandbox sees %q", got)
	}
	// The pool's guests carry the usual limits ahead; a hand-out asking
	// for others gets those.
	if got := memoryLimit(*d.get(sb.ID)); got != 1<<30 {
		t.Errorf("handed-out sandbox: memory limit %d, want the default 1 GiB", got)
	}
	other, err := c.Create(ctx, api.CreateRequest{From: "pooled", Resources: api.Resources{MemoryBytes: 700 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Sh(other.ID, "echo $POOL"); got != "yes\n" {
		t.Fatalf("second sandbox sees %q", got)
	}
	if got := memoryLimit(*d.get(other.ID)); got != 700<<20 {
		t.Errorf("sandbox asking for 700 MiB: memory limit %d", got)
	}
	d.MustCLI("rm", "-f", other.ID)
	// Out of the pool (whose refill may already have replaced it: the
	// count alone would race with it).
	if _, err := os.Stat(filepath.Join(d.RunDir, "warm", sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("handed-out sandbox %s still in the pool: %v", sb.ID, err)
	}
	if !waitFor(30*time.Second, 50*time.Millisecond, full) {
		p, _ := c.Pools(ctx)
		t.Fatalf("pool did not refill: %+v", p)
	}
	// A restarted daemon refills the template's pool, and hands out of it.
	d.Stop()
	d.Start()
	c = d.Client()
	if !waitFor(30*time.Second, 50*time.Millisecond, full) {
		p, _ := c.Pools(ctx)
		t.Fatalf("pools did not fill after a restart: %+v", p)
	}
	ents, _ = os.ReadDir(filepath.Join(d.RunDir, "warm"))
	warm = map[string]bool{}
	for _, e := range ents {
		warm[e.Name()] = true
	}
	again, err := c.Create(ctx, api.CreateRequest{From: "pooled"})
	if err != nil || !warm[again.ID] {
		t.Fatalf("create after a restart: %v, %s not handed out of %v", err, again.ID, warm)
	}
	// A create with another disk size cannot use the pool's sandboxes.
	if _, err := c.Create(ctx, api.CreateRequest{From: "pooled", Resources: api.Resources{DiskBytes: 64 << 20}}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("create from a template with another disk size: %v", err)
	}
	// `pool set template:NAME` is the template's warm, recorded with it.
	d.MustCLI("pool", "set", "template:pooled", "1")
	if got, err := c.GetTemplate(ctx, "pooled"); err != nil || got.Warm != 1 {
		t.Fatalf("template after pool set 1: %+v, %v", got, err)
	}
	if p, _ := c.Pools(ctx); p.Target["template:pooled"] != 1 || p.Ready["template:pooled"] > 1 {
		t.Fatalf("pools after pool set template:pooled 1: %+v", p)
	}
	d.MustCLI("template", "rm", "pooled")
	p, _ := c.Pools(ctx)
	if _, ok := p.Target["template:pooled"]; ok || p.Ready["template:pooled"] != 0 {
		t.Fatalf("pools after template rm: %+v", p)
	}
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool {
		ents, _ := os.ReadDir(filepath.Join(d.RunDir, "warm"))
		return len(ents) == 1
	}) {
		t.Fatalf("warm guests of a removed template remain")
	}
	if got := d.Sh(sb.ID, "cat /opt/p.txt"); got != "pooled\n" {
		t.Fatalf("sandbox after template rm sees %q", got)
	}
}

// freezerState reads the freezer state of the daemon's cgroup id: v1's
// freezer.state, or v2's cgroup.freeze.
// cpuUsage is the CPU time sandbox id's cgroup has used.
func cpuUsage(d *Daemon, id string) time.Duration {
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", d.Cgroup, id, "cpuacct.usage")); err == nil {
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return time.Duration(n)
	}
	b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", d.Cgroup, id, "cpu.stat"))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return time.Duration(n) * time.Microsecond
		}
	}
	return 0
}

func freezerState(d *Daemon, id string) string {
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", d.Cgroup, id, "freezer.state")); err == nil {
		return strings.TrimSpace(string(b))
	}
	b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", d.Cgroup, id, "cgroup.freeze"))
	return strings.TrimSpace(string(b))
}

// TestTemplateBuildNetwork: a build's run steps reach the network only as
// the spec's policy allows (default: nothing), and sandboxes made from the
// template keep that policy.
func TestTemplateBuildNetwork(t *testing.T) {
	u := newUpstream(t, egressNames)
	d := netDaemon(t, u)
	c := d.Client()
	ctx := context.Background()
	fetch := "curl -sS --max-time 5 --noproxy '*' http://allowed.test/fetched > /opt/got.txt"
	if _, err := c.BuildTemplate(ctx, api.TemplateSpec{Name: "offline", Steps: []api.TemplateStep{{Run: fetch}}}, nil); err == nil || !strings.Contains(err.Error(), "exited with code") {
		t.Fatalf("a fetch without a policy: %v", err)
	}
	policy := &api.Policy{Allow: []api.PolicyRule{{Match: "allowed.test"}}}
	tpl, err := c.BuildTemplate(ctx, api.TemplateSpec{Name: "online", Policy: policy, Steps: []api.TemplateStep{{Run: fetch}}}, nil)
	if err != nil {
		t.Fatalf("a fetch the policy allows: %v", err)
	}
	if tpl.Policy == nil || len(tpl.Policy.Allow) != 1 {
		t.Fatalf("template policy: %+v", tpl.Policy)
	}
	id := d.Create(api.CreateRequest{From: "online"})
	if got := d.Sh(id, "cat /opt/got.txt"); got != "hello from allowed.test GET /fetched\n" {
		t.Fatalf("the fetched file holds %q", got)
	}
	mustSay(t, curl(d, id, "http://allowed.test/again"), "hello from allowed.test GET /again")
	mustFail(t, curl(d, id, "http://other.test/"), "a host the template's policy does not allow")
}

// TestTemplateBuildCutShort: a build does not outlive its daemon: after a
// kill -9 in the middle of one, the next daemon removes its build sandbox
// and the step snapshots no template recorded.
func TestTemplateBuildCutShort(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := c.BuildTemplate(ctx, api.TemplateSpec{Name: "cut", Steps: []api.TemplateStep{
			{Run: "echo one > /opt/one"}, {Run: "sleep 60"},
		}}, nil)
		done <- err
	}()
	if !waitFor(30*time.Second, 20*time.Millisecond, func() bool {
		snaps, _ := c.Snapshots(ctx, "")
		return len(snaps) == 1
	}) {
		t.Fatal("the build's first step was not captured")
	}
	d.Kill9()
	if err := <-done; err == nil {
		t.Fatal("a build whose daemon was killed succeeded")
	}
	d.Start()
	c = d.Client()
	if snaps, _ := c.Snapshots(ctx, ""); len(snaps) != 0 {
		t.Fatalf("%d step snapshots of the cut build remain", len(snaps))
	}
	if list, _ := c.List(ctx, client.ListOptions{}); len(list) != 0 {
		t.Fatalf("the cut build's sandbox remains: %+v", list)
	}
	if _, err := c.GetTemplate(ctx, "cut"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the cut template: %v", err)
	}
}

// TestImagePool: `paddock pool set image:NAME N` keeps N sandboxes of an
// image ready; a create of that image is a hand-out; the size outlives a
// restart; a pooled image cannot be removed; bad names and sizes are 400s.
func TestImagePool(t *testing.T) {
	d := StartDaemon(t, "--warm-guests", "0")
	c := d.Client()
	ctx := context.Background()
	fx := buildImages(t)
	d.MustCLI("image", "import", "--name", "e2e/pool:v1", dockerSave(t, fx.app, "e2e/pool:v1"))

	if got := d.MustCLI("pool", "set", "image:e2e/pool:v1", "2"); !strings.HasPrefix(got, "image:e2e/pool:v1\t") {
		t.Fatalf("pool set printed %q", got)
	}
	full := func() bool {
		p, err := c.Pools(ctx)
		return err == nil && p.Ready["image:e2e/pool:v1"] == 2 && p.Target["image:e2e/pool:v1"] == 2
	}
	if !waitFor(30*time.Second, 50*time.Millisecond, full) {
		p, _ := c.Pools(ctx)
		t.Fatalf("image pool did not fill: %+v\n%s", p, d.Log())
	}
	if ls := d.MustCLI("pool", "ls"); !strings.Contains(ls, "image:e2e/pool:v1  2      2") {
		t.Fatalf("pool ls:\n%s", ls)
	}
	warm := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(d.RunDir, "warm"))
	for _, e := range ents {
		warm[e.Name()] = true
	}
	sb, err := c.Create(ctx, api.CreateRequest{Image: "e2e/pool:v1"})
	if err != nil {
		t.Fatal(err)
	}
	if !warm[sb.ID] {
		t.Fatalf("sandbox %s was not handed out of the image pool %v", sb.ID, warm)
	}
	if got := d.Sh(sb.ID, "cat /app/hello.txt; echo $GREETING"); got != "hello from the image\nhello-env\n" {
		t.Fatalf("handed-out sandbox sees %q", got)
	}
	// The pooled image is in use until its pool goes.
	if r := d.CLI("image", "rm", "e2e/pool:v1"); r.Code == 0 || !strings.Contains(r.Stderr, "warm pool image:e2e/pool:v1") {
		t.Fatalf("image rm of a pooled image: exit %d, %s", r.Code, r.Stderr)
	}
	for _, bad := range []struct{ body, want string }{
		{`{"name":"image:e2e/nope:v9","size":1}`, "not_found"},
		{`{"name":"e2e/pool:v1","size":1}`, "image:NAME or template:NAME"},
		{`{"name":"image:e2e/pool:v1","size":-1}`, "size"},
		{`{"name":"image:e2e/pool:v1","size":65}`, "size"},
		{`{"name":"image:e2e/pool:v1","size":1,"extra":true}`, "extra"},
		{`{"name":"template:nope","size":1}`, "not_found"},
		{`{"name":"template:../x","size":1}`, "invalid_argument"},
	} {
		a := d.do("PUT", "/v1/pools", bad.body)
		if a.Status < 400 || a.Status >= 500 || !strings.Contains(string(a.Body), bad.want) {
			t.Errorf("PUT /v1/pools %s: %d %s, want a 4xx naming %q", bad.body, a.Status, a.Body, bad.want)
		}
	}
	if p, _ := c.Pools(ctx); p.Target["image:e2e/pool:v1"] != 2 {
		t.Fatalf("refused requests changed the pool: %+v", p)
	}

	// The size is recorded: a restarted daemon refills the pool.
	d.Stop()
	d.Start()
	c = d.Client()
	if !waitFor(30*time.Second, 50*time.Millisecond, full) {
		p, _ := c.Pools(ctx)
		t.Fatalf("image pool did not refill after a restart: %+v", p)
	}
	d.MustCLI("pool", "set", "image:e2e/pool:v1", "0")
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool {
		ents, _ := os.ReadDir(filepath.Join(d.RunDir, "warm"))
		return len(ents) == 0
	}) {
		t.Fatalf("warm guests of a removed pool remain")
	}
	if err := c.Delete(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	d.MustCLI("image", "rm", "e2e/pool:v1")
	d.Stop()
	d.Start()
	if p, _ := d.Client().Pools(ctx); len(p.Target) != 0 {
		t.Fatalf("pools after removing the pool and a restart: %+v", p)
	}
}
