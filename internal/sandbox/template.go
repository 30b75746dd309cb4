package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/snapshot"
	"github.com/paddock-dev/paddock/internal/storage/image"
	"github.com/paddock-dev/paddock/internal/template"
	"github.com/paddock-dev/paddock/wire"
)

// templateState serializes template builds and removals: a build replaces a
// record and moves snapshot holds, which must not interleave.
type templateState struct {
	mu sync.Mutex
}

var errNoTemplates = errdefs.New(errdefs.ErrUnavailable, "templates are not configured")

// Labels of a build's sandbox and of the snapshots of its steps.
const (
	buildLabel    = "paddock.template-build"
	templateLabel = "paddock.template"
	stepLabel     = "paddock.template-step"
)

// stepTimeout bounds one run step of a build.
const stepTimeout = time.Hour

// holder is how a template holds its steps' snapshots.
func holder(name string) string { return "template:" + name }

// poolName names a template's warm pool.
func poolName(name string) string { return "template:" + name }

// checkTemplate validates a spec with the sandbox rules and fills its
// defaults.
func (m *Manager) checkTemplate(spec *api.TemplateSpec) error {
	if spec.Image == "" && len(spec.Containers) == 0 {
		spec.Image = image.HostImage
	}
	if err := template.Check(spec); err != nil {
		return err
	}
	if _, err := m.cfg.Images.Get(spec.Name); err == nil {
		return errdefs.Invalid("name", "%q names an image; a template needs a name of its own", spec.Name)
	}
	req := api.CreateRequest{Resources: spec.Resources, Containers: spec.Containers, SharedVolumes: spec.SharedVolumes}
	if err := validateCreate(&req, hostCPUs()); err != nil {
		return err
	}
	if len(spec.Containers) > 0 {
		// Its groups are creates of these containers: checked as one,
		// with the daemon's images and volumes, making nothing.
		if tier, err := m.tier(spec.Runtime); err != nil {
			return err
		} else if tier != "native" {
			return errdefs.Invalid("runtime", "a template of containers needs the native runtime, not %s", tier)
		}
		if _, err := m.planGroup(&req, "template", m.withDefaults(spec.Resources)); err != nil {
			return err
		}
	}
	for i, s := range spec.Steps {
		field := fmt.Sprintf("steps[%d]", i)
		if err := reqcheck.Env(field+".env", s.Env); err != nil {
			return err
		}
		if err := reqcheck.Path(field+".workdir", s.Workdir); err != nil {
			return err
		}
		if s.Copy != nil {
			if err := reqcheck.Path(field+".copy.dest", s.Copy.Dest); err != nil {
				return err
			}
		}
	}
	return m.validatePolicy(spec.Policy)
}

// planned is a step with what the build needs of it.
type planned struct {
	step    api.TemplateStep
	key     string
	put     template.Put
	env     map[string]string // after this step
	workdir string
}

// plan computes every step's cache key and the environment and workdir
// after it.
func plan(spec api.TemplateSpec, img *image.Image, files *template.Context) ([]planned, error) {
	out := make([]planned, len(spec.Steps))
	key := template.BaseKey(img.ID, spec.Policy)
	env := map[string]string{}
	workdir := ""
	for i, s := range spec.Steps {
		p := planned{step: s}
		content := ""
		if s.Copy != nil {
			put, err := files.Resolve(*s.Copy)
			if err != nil {
				return nil, fmt.Errorf("steps[%d]: %w", i, err)
			}
			p.put, content = put, put.Hash
		}
		maps.Copy(env, s.Env)
		if s.Workdir != "" {
			workdir = s.Workdir
		}
		key = template.StepKey(key, s, content)
		p.key, p.env, p.workdir = key, maps.Clone(env), workdir
		out[i] = p
	}
	return out, nil
}

// Build builds spec: each step whose cache key a template already
// holds a snapshot for is reused, the rest run in one build sandbox, and
// each is captured as a snapshot the template holds. emit receives the
// build's log. The build sandbox is removed afterwards; so are the
// snapshots of a build that fails.
func (s Templates) Build(ctx context.Context, spec api.TemplateSpec, files *template.Context, emit func(api.TemplateEvent)) (api.Template, error) {
	m := s.m
	if m.cfg.Templates == nil || m.cfg.Snapshots == nil {
		return api.Template{}, errNoTemplates
	}
	if err := m.checkTemplate(&spec); err != nil {
		return api.Template{}, err
	}
	if len(spec.Containers) > 0 {
		return m.buildGroup(spec)
	}
	if files == nil {
		files = template.NewContext()
	}
	img, err := m.cfg.Images.Get(spec.Image)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return api.Template{}, errdefs.Invalid("image", "unknown image %q", spec.Image)
		}
		return api.Template{}, err
	}
	steps, err := plan(spec, img, files)
	if err != nil {
		return api.Template{}, err
	}
	m.tpl.mu.Lock()
	defer m.tpl.mu.Unlock()
	start := time.Now()
	name := spec.Name
	results := make([]api.TemplateStepResult, len(steps))
	// The previous version's snapshots stay held if this build fails.
	before := map[string]bool{}
	if old, err := m.cfg.Templates.Get(name); err == nil {
		for _, s := range old.Steps {
			before[s.Snapshot] = true
		}
	}
	var held, made []string // holds taken and snapshots made by this build
	ok := false
	defer func() {
		if ok {
			return
		}
		for _, id := range held {
			if !before[id] {
				m.cfg.Snapshots.Drop(id, holder(name))
			}
		}
		for _, id := range made {
			if !m.cfg.Templates.Holds(id) {
				m.cfg.Snapshots.Remove(id)
			}
		}
	}()
	hits := 0
	for i, s := range steps {
		id, cached := m.cfg.Templates.Cached(s.key)
		if !cached || m.cfg.Snapshots.Hold(id, holder(name)) != nil {
			break
		}
		held = append(held, id)
		results[i] = api.TemplateStepResult{Key: s.key, Snapshot: id, Cached: true}
		emit(api.TemplateEvent{Step: i + 1, Steps: len(steps), Action: template.Action(s.step), Cache: "hit"})
		hits++
	}
	if hits < len(steps) {
		sb, err := m.buildSandbox(ctx, spec, results, hits)
		if err != nil {
			return api.Template{}, err
		}
		defer func() {
			if err := m.Remove(context.Background(), sb, true); err != nil {
				m.log.Warn("removing a template's build sandbox", "template", name, "sandbox", sb, "err", err)
			}
		}()
		for i := hits; i < len(steps); i++ {
			emit(api.TemplateEvent{Step: i + 1, Steps: len(steps), Action: template.Action(steps[i].step), Cache: "miss"})
			env, workdir := map[string]string{}, ""
			if i > 0 {
				env, workdir = steps[i-1].env, steps[i-1].workdir
			}
			if err := m.runStep(ctx, sb, steps[i], env, workdir, emit); err != nil {
				return api.Template{}, fmt.Errorf("step %d (%s): %w", i+1, template.Action(steps[i].step), err)
			}
			id, err := m.captureStep(ctx, sb, spec, steps[i], i)
			if err != nil {
				return api.Template{}, fmt.Errorf("step %d: capturing: %w", i+1, err)
			}
			made = append(made, id)
			if err := m.cfg.Snapshots.Hold(id, holder(name)); err != nil {
				return api.Template{}, err
			}
			held = append(held, id)
			results[i] = api.TemplateStepResult{Key: steps[i].key, Snapshot: id}
		}
	}
	last := steps[len(steps)-1]
	final, err := m.cfg.Snapshots.Get(results[len(results)-1].Snapshot)
	if err != nil {
		return api.Template{}, err
	}
	t := api.Template{
		Name:        name,
		Image:       img.Name,
		Snapshot:    final.ID,
		Env:         last.env,
		Workdir:     last.workdir,
		Resources:   final.Resources,
		Policy:      spec.Policy,
		Warm:        spec.Warm,
		Steps:       results,
		Spec:        spec,
		CreatedAt:   time.Now().UTC(),
		BuildMS:     ms(time.Since(start)),
		CacheHits:   hits,
		CacheMisses: len(steps) - hits,
	}
	if len(t.Env) == 0 {
		t.Env = nil
	}
	old, err := m.cfg.Templates.Put(t)
	if err != nil {
		return api.Template{}, err
	}
	ok = true
	// The pool moves to the new snapshot before the old one can go.
	m.setTemplatePool(t)
	if old != nil {
		m.releaseSteps(name, old.Steps, results)
	}
	t.WarmReady = m.poolSizes()[poolName(name)]
	m.log.Info("template built", "template", name, "steps", len(steps), "cache_hits", hits, "cache_misses", t.CacheMisses, "build_ms", t.BuildMS)
	return t, nil
}

// buildGroup records a group template (checked): it has no steps to run,
// its groups are made by its warm pool or on create. A template of steps
// it replaces drops its snapshots.
func (m *Manager) buildGroup(spec api.TemplateSpec) (api.Template, error) {
	m.tpl.mu.Lock()
	defer m.tpl.mu.Unlock()
	t := api.Template{
		Name:      spec.Name,
		Resources: spec.Resources,
		Policy:    spec.Policy,
		Warm:      spec.Warm,
		Steps:     []api.TemplateStepResult{},
		Spec:      spec,
		CreatedAt: time.Now().UTC(),
	}
	old, err := m.cfg.Templates.Put(t)
	if err != nil {
		return api.Template{}, err
	}
	m.setTemplatePool(t)
	if old != nil {
		m.releaseSteps(spec.Name, old.Steps, nil)
	}
	t.WarmReady = m.poolSizes()[poolName(spec.Name)]
	m.log.Info("group template recorded", "template", spec.Name, "containers", len(spec.Containers), "warm", spec.Warm)
	return t, nil
}

// buildSandbox makes the sandbox a build's missing steps run in: from the
// snapshot of the last cached step, or the bare image.
func (m *Manager) buildSandbox(ctx context.Context, spec api.TemplateSpec, results []api.TemplateStepResult, hits int) (string, error) {
	req := api.CreateRequest{
		Image:          spec.Image,
		Resources:      spec.Resources,
		Policy:         spec.Policy,
		Runtime:        spec.Runtime,
		TimeoutSeconds: int64(2 * stepTimeout / time.Second),
		Labels:         map[string]string{buildLabel: spec.Name},
	}
	if hits > 0 {
		req.From = results[hits-1].Snapshot
		// The snapshot's own environment is the template's; the build
		// passes it to each step instead.
		req.Resources.DiskBytes = 0
	}
	sb, err := m.Create(ctx, req)
	if err != nil {
		return "", fmt.Errorf("making the build sandbox: %w", err)
	}
	return sb.ID, nil
}

// runStep applies one step in build sandbox id, under the environment and
// workdir the earlier steps set.
func (m *Manager) runStep(ctx context.Context, id string, s planned, env map[string]string, workdir string, emit func(api.TemplateEvent)) error {
	gc, err := m.Guest(ctx, id)
	if err != nil {
		return err
	}
	switch {
	case s.step.Run != "":
		return runCommand(ctx, gc, &guestapi.StartRequest{
			Cmd: []string{"/bin/sh", "-c", s.step.Run}, Env: guestapi.EnvList(env), Cwd: workdir,
			TimeoutSeconds: int64(stepTimeout / time.Second),
		}, emit)
	case s.step.Copy != nil:
		if err := mkdirAll(ctx, gc, s.put.Dir); err != nil {
			return err
		}
		var tarball bytes.Buffer
		if err := s.put.WriteTar(&tarball); err != nil {
			return err
		}
		end, err := gc.TarPut(ctx, guestapi.FileRequest{Path: s.put.Dir}, &tarball)
		if err != nil {
			return err
		}
		if end.Error != nil {
			// The guest's category is kept: a context the sandbox refuses
			// is the caller's fault, not the daemon's.
			if cat := errdefs.FromCode(end.Error.Code); cat != nil {
				return fmt.Errorf("%w: copying into %s: %s", cat, s.put.Dir, end.Error.Message)
			}
			return fmt.Errorf("copying into %s: %s", s.put.Dir, end.Error.Message)
		}
	case s.step.Workdir != "":
		return mkdirAll(ctx, gc, s.step.Workdir)
	}
	return nil
}

func mkdirAll(ctx context.Context, gc *guestapi.Client, dir string) error {
	if dir == "/" {
		return nil
	}
	_, err := gc.Mkdir(ctx, guestapi.FileRequest{Path: dir, Parents: true})
	if err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	return nil
}

// runCommand runs a command to its end, passing its output to emit; a
// non-zero exit is an error.
func runCommand(ctx context.Context, gc *guestapi.Client, start *guestapi.StartRequest, emit func(api.TemplateEvent)) error {
	_, conn, err := gc.StartAttached(ctx, start)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Conn.Close() })
	defer stop()
	for {
		f, err := conn.Frames.Read()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("reading the step's output: %w", err)
		}
		switch f.Type {
		case wire.Stdout:
			emit(api.TemplateEvent{Stream: "stdout", Data: string(f.Payload)})
		case wire.Stderr:
			emit(api.TemplateEvent{Stream: "stderr", Data: string(f.Payload)})
		case wire.Error:
			var e api.Error
			json.Unmarshal(f.Payload, &e)
			return errors.New(e.Message)
		case wire.Exit:
			var st api.ExitStatus
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				return fmt.Errorf("decoding the exit status: %w", err)
			}
			// The step's own failure is the spec's problem, not the
			// daemon's: the client sees it in full.
			switch {
			case st.Error != "":
				return errdefs.New(errdefs.ErrInvalid, "%s", st.Error)
			case st.TimedOut:
				return errdefs.New(errdefs.ErrInvalid, "timed out after %s", stepTimeout)
			case st.Signal != "":
				return errdefs.New(errdefs.ErrInvalid, "killed by %s", st.Signal)
			case st.ExitCode != 0:
				return errdefs.New(errdefs.ErrInvalid, "exited with code %d", st.ExitCode)
			}
			return nil
		}
	}
}

// captureStep snapshots build sandbox id after step i; the snapshot
// carries the template's environment and workdir up to that step.
func (m *Manager) captureStep(ctx context.Context, id string, spec api.TemplateSpec, s planned, i int) (string, error) {
	b, err := m.lookup(id)
	if err != nil {
		return "", err
	}
	p, err := m.cfg.Snapshots.Begin()
	if err != nil {
		return "", err
	}
	labels := map[string]string{templateLabel: spec.Name, stepLabel: strconv.Itoa(i + 1)}
	snap, err := m.snapshot(ctx, b, p, api.SnapshotRequest{Labels: labels})
	if err != nil {
		p.Abort()
		return "", err
	}
	snap.Env, snap.Workdir, snap.Policy = s.env, s.workdir, spec.Policy
	if len(snap.Env) == 0 {
		snap.Env = nil
	}
	snap, err = p.Commit(snap)
	if err != nil {
		return "", err
	}
	return snap.ID, nil
}

// releaseSteps drops template name's holds on the old steps it no longer
// has, removing the snapshots no template holds any more.
func (m *Manager) releaseSteps(name string, old, kept []api.TemplateStepResult) {
	keep := map[string]bool{}
	for _, s := range kept {
		keep[s.Snapshot] = true
	}
	for _, s := range old {
		if keep[s.Snapshot] {
			continue
		}
		m.cfg.Snapshots.Drop(s.Snapshot, holder(name))
		if m.cfg.Templates.Holds(s.Snapshot) {
			continue
		}
		if err := m.cfg.Snapshots.Remove(s.Snapshot); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log.Warn("removing an unused template step", "template", name, "snapshot", s.Snapshot, "err", err)
		}
	}
}

// List lists the templates.
func (s Templates) List(ctx context.Context) ([]api.Template, error) {
	m := s.m
	if m.cfg.Templates == nil {
		return nil, errNoTemplates
	}
	list := m.cfg.Templates.List()
	ready := m.poolSizes()
	for i := range list {
		list[i].WarmReady = ready[poolName(list[i].Name)]
	}
	return list, nil
}

// Get describes one template.
func (s Templates) Get(ctx context.Context, name string) (api.Template, error) {
	m := s.m
	if m.cfg.Templates == nil {
		return api.Template{}, errNoTemplates
	}
	if err := template.ValidName(name); err != nil {
		return api.Template{}, err
	}
	t, err := m.cfg.Templates.Get(name)
	if err != nil {
		return api.Template{}, err
	}
	t.WarmReady = m.poolSizes()[poolName(name)]
	return t, nil
}

// Remove deletes a template, its warm pool and the step snapshots
// no other template holds. Sandboxes made from it keep their files.
func (s Templates) Remove(ctx context.Context, name string) error {
	m := s.m
	unlock, err := m.lockTemplate(name)
	if err != nil {
		return err
	}
	defer unlock()
	t, err := m.cfg.Templates.Delete(name)
	if err != nil {
		return err
	}
	if p, ok := m.cfg.Runtime.(runtime.Pools); ok {
		p.SetPool(poolName(name), runtime.PoolSource{}, 0)
	}
	m.setGroupPool(name, t, 0)
	m.releaseSteps(name, t.Steps, nil)
	m.log.Info("template removed", "template", name)
	return nil
}

// lockTemplate checks that templates are on and name is one's, then takes
// the lock that orders changes to templates.
func (m *Manager) lockTemplate(name string) (unlock func(), err error) {
	if m.cfg.Templates == nil {
		return nil, errNoTemplates
	}
	if err := template.ValidName(name); err != nil {
		return nil, err
	}
	m.tpl.mu.Lock()
	return m.tpl.mu.Unlock, nil
}

// Restore, at start-up, holds the templates' step snapshots again
// (holds live in memory) and starts their warm pools. What a build cut
// short by the daemon's end left (its build sandbox, the step snapshots
// no template recorded) is removed: a build does not outlive the daemon.
func (s Templates) Restore(ctx context.Context) {
	m := s.m
	if m.cfg.Templates == nil || m.cfg.Snapshots == nil {
		return
	}
	// The groups a previous daemon made for the pools are adopted before
	// the refill makes any.
	m.gp.hold(true)
	defer m.gp.hold(false)
	for _, t := range m.cfg.Templates.List() {
		for _, s := range t.Steps {
			if err := m.cfg.Snapshots.Hold(s.Snapshot, holder(t.Name)); err != nil {
				m.log.Warn("a template's step snapshot is missing; rebuild the template", "template", t.Name, "snapshot", s.Snapshot, "err", err)
			}
		}
		m.setTemplatePool(t)
	}
	m.adoptGroups(ctx)
	for _, sb := range m.List(ctx, Filter{}) {
		if sb.Labels[buildLabel] == "" {
			continue
		}
		m.log.Info("removing the sandbox of an unfinished template build", "sandbox", sb.ID, "template", sb.Labels[buildLabel])
		if err := m.Remove(ctx, sb.ID, true); err != nil {
			m.log.Warn("removing an unfinished build's sandbox", "sandbox", sb.ID, "err", err)
		}
	}
	for _, s := range m.cfg.Snapshots.List("") {
		if s.Labels[stepLabel] == "" || m.cfg.Templates.Holds(s.ID) {
			continue
		}
		m.log.Info("removing a step snapshot of an unfinished template build", "snapshot", s.ID, "template", s.Labels[templateLabel])
		if err := m.cfg.Snapshots.Remove(s.ID); err != nil {
			m.log.Warn("removing an unfinished build's snapshot", "snapshot", s.ID, "err", err)
		}
	}
}

// setTemplatePool keeps t.Warm sandboxes of t ready, if the runtime has
// pools.
func (m *Manager) setTemplatePool(t api.Template) {
	// A group template's pool is the manager's; a template that stops
	// being one drops it.
	m.setGroupPool(t.Name, t, t.Warm)
	p, ok := m.cfg.Runtime.(runtime.Pools)
	if !ok {
		return
	}
	if t.Warm == 0 || isGroup(t) {
		p.SetPool(poolName(t.Name), runtime.PoolSource{}, 0)
		return
	}
	snap, err := m.cfg.Snapshots.Get(t.Snapshot)
	if err != nil {
		m.log.Warn("no warm pool for a template without its snapshot", "template", t.Name, "err", err)
		return
	}
	img, err := m.cfg.Snapshots.ImagePath(snap.ID)
	if err != nil {
		return
	}
	imageName := snap.Image
	p.SetPool(poolName(t.Name), runtime.PoolSource{
		Image:     func() (*image.Image, error) { return m.cfg.Images.Get(imageName) },
		DiskFrom:  img,
		DiskBytes: snap.SizeBytes,
		Limits:    m.withDefaults(snap.Resources),
	}, t.Warm)
}

func (m *Manager) poolSizes() map[string]int {
	var sizes map[string]int
	if p, ok := m.cfg.Runtime.(runtime.Pools); ok {
		sizes = p.PoolSizes()
	}
	return m.gp.report(sizes, true)
}

// List reports the warm pools: ready sandboxes and target sizes.
func (s Pools) List(ctx context.Context) api.Pools {
	m := s.m
	out := api.Pools{Ready: map[string]int{}, Target: map[string]int{}}
	if p, ok := m.cfg.Runtime.(runtime.Pools); ok {
		out.Ready, out.Target = p.PoolSizes(), p.PoolTargets()
	}
	out.Ready, out.Target = m.gp.report(out.Ready, true), m.gp.report(out.Target, false)
	return out
}

// templateSnapshot returns the final snapshot of the template named from,
// if there is one.
// templateRuntime is the runtime template name's spec asks for ("" for
// the default).
func (m *Manager) templateRuntime(name string) string {
	if m.cfg.Templates == nil {
		return ""
	}
	t, err := m.cfg.Templates.Get(name)
	if err != nil {
		return ""
	}
	return t.Spec.Runtime
}

func (m *Manager) templateSnapshot(from string) (string, bool) {
	if m.cfg.Templates == nil || snapshot.IsID(from) {
		return "", false
	}
	t, err := m.cfg.Templates.Get(from)
	if err != nil {
		return "", false
	}
	return t.Snapshot, true
}
