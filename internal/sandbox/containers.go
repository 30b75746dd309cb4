package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/storage/image"
)

// A sandbox made with containers (api.CreateRequest.Containers) is a
// group: its first container is the sandbox's own guest, as any sandbox's
// (its id, cgroup, network, record); every other is a **member**, a guest
// of its own that the runtime starts in the first one's network namespace
// and inside its cgroup (runtime.Spec.Join), under the runtime id
// runtime.ContainerID(sandbox, name). Shared volumes are named volumes
// made with the sandbox ("ID-NAME") and removed with it. A sandbox made
// without containers has none of this: every path below is skipped.

// maxContainers bounds the containers of one sandbox.
const maxContainers = 16

// member is a running container of a sandbox beside its first.
type member struct {
	name  string
	inst  runtime.Instance
	guest *guestapi.Client
}

// memberRecord is what the store keeps of a member.
type memberRecord struct {
	Name    string          `json:"name"`
	UIDBase uint32          `json:"uid_base"`
	Runtime json.RawMessage `json:"runtime_state,omitempty"`
	// Volumes are its mounts with shared volumes resolved to the named
	// volumes that hold them.
	Volumes []api.VolumeMount `json:"volumes,omitempty"`
}

// validateContainers checks a create's containers and shared volumes
// without the daemon's state (images and limits come in plan).
func validateContainers(req *api.CreateRequest) error {
	if len(req.Containers) == 0 {
		if len(req.SharedVolumes) > 0 {
			return errdefs.Invalid("shared_volumes", "need containers to mount them")
		}
		return nil
	}
	switch {
	case len(req.Containers) > maxContainers:
		return errdefs.Invalid("containers", "more than %d", maxContainers)
	case req.Image != "":
		return errdefs.Invalid("image", "set each container's image instead when containers are given")
	case len(req.Env) > 0:
		return errdefs.Invalid("env", "set each container's env instead when containers are given")
	case req.Workdir != "":
		return errdefs.Invalid("workdir", "set each container's workdir instead when containers are given")
	case len(req.Volumes) > 0:
		return errdefs.Invalid("volumes", "set each container's mounts instead when containers are given")
	case req.From != "":
		return errdefs.Invalid("from", "a sandbox started from a snapshot of several containers takes its containers from it; from a snapshot of one, or a template, it cannot have several yet")
	}
	shared := map[string]bool{}
	for i, v := range req.SharedVolumes {
		field := fmt.Sprintf("shared_volumes[%d]", i)
		switch {
		case !api.IsContainerName(v.Name):
			return errdefs.Invalid(field+".name", "%q: want 1 to %d of a-z, 0-9 and single '-', starting with a letter", v.Name, api.MaxContainerName)
		case shared[v.Name]:
			return errdefs.Invalid(field+".name", "%q is named twice", v.Name)
		case v.SizeBytes < 0 || (v.SizeBytes > 0 && v.SizeBytes < minDisk) || v.SizeBytes > maxDisk:
			return errdefs.Invalid(field+".size_bytes", "%d is outside 16 MiB..16 TiB", v.SizeBytes)
		case v.Volume != "":
			return errdefs.Invalid(field+".volume", "is set by the daemon")
		}
		shared[v.Name] = true
	}
	names := map[string]bool{}
	egress := ""
	for i, c := range req.Containers {
		field := fmt.Sprintf("containers[%d]", i)
		switch {
		case c.Role != "" && c.Role != api.RoleEgress:
			return errdefs.Invalid(field+".role", "%q: want %q or none", c.Role, api.RoleEgress)
		case c.Role == api.RoleEgress && egress != "":
			return errdefs.Invalid(field+".role", "container %s is the egress sidecar already: at most one", egress)
		case c.Role == api.RoleEgress && (c.EgressPort < 1 || c.EgressPort > 65535):
			return errdefs.Invalid(field+".egress_port", "%d: want the port the sidecar listens on, 1..65535", c.EgressPort)
		case c.Role != api.RoleEgress && c.EgressPort != 0:
			return errdefs.Invalid(field+".egress_port", "only the egress sidecar (role %q) has one", api.RoleEgress)
		case c.Role == api.RoleEgress:
			egress = c.Name
		}
		if !api.IsContainerName(c.Name) {
			return errdefs.Invalid(field+".name", "%q: want 1 to %d of a-z, 0-9 and single '-', starting with a letter", c.Name, api.MaxContainerName)
		}
		if names[c.Name] {
			return errdefs.Invalid(field+".name", "%q is named twice", c.Name)
		}
		names[c.Name] = true
		if len(c.Image) > 256 || strings.ContainsRune(c.Image, 0) {
			return errdefs.Invalid(field+".image", "not an image name")
		}
		if err := reqcheck.Env(field+".env", c.Env); err != nil {
			return err
		}
		if err := reqcheck.Path(field+".workdir", c.Workdir); err != nil {
			return err
		}
		if len(c.Command) > 0 {
			exec := api.ExecRequest{Cmd: c.Command, User: c.User}
			if err := reqcheck.Exec(&exec); err != nil {
				return fmt.Errorf("%s.command: %w", field, err)
			}
		} else if c.User != "" {
			return errdefs.Invalid(field+".user", "runs the command, and there is none")
		}
		if i == 0 && c.Resources != (api.Resources{}) {
			return errdefs.Invalid(field+".resources", "the first container runs under the sandbox's own limits: set them in resources")
		}
		if err := validateLimits(c.Resources, nil, nil, hostCPUs()); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		if err := validateVolumes(c.Mounts); err != nil {
			return fmt.Errorf("%s.mounts: %w", field, err)
		}
		if err := validateSupervision(field, c); err != nil {
			return err
		}
	}
	if err := validateDependsOn(req.Containers); err != nil {
		return err
	}
	return validateControls(req.Containers)
}

// group is a create's containers, checked against the daemon's state.
type group struct {
	id         string // the sandbox's, chosen ahead
	containers []api.Container
	images     []*image.Image
	// vols are each container's mounts, shared volumes resolved.
	vols   [][]api.VolumeMount
	shared []api.SharedVolume // Volume set
	// diskFrom are the members' disks to start from (a snapshot's, a
	// fork's), by name; nil: new disks.
	diskFrom map[string]string
	// sharedFrom are the shared volumes' images to start from, by name;
	// nil: new and empty.
	sharedFrom map[string]string
	// background: a warm pool's group, its services started at a
	// background CPU weight (grouppool.go).
	background bool
}

// planGroup resolves req's containers for sandbox id, whose limits are
// res: their images, their limits within res, the named volumes their
// mounts and the shared volumes name. It makes nothing.
func (m *Manager) planGroup(req *api.CreateRequest, id string, res api.Resources) (*group, error) {
	g := &group{id: id, containers: req.Containers}
	sharedVol := map[string]string{}
	for _, v := range req.SharedVolumes {
		v.Volume = id + "-" + v.Name
		sharedVol[v.Name] = v.Volume
		g.shared = append(g.shared, v)
	}
	if len(g.shared) > 0 && m.cfg.Volumes == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "volumes are not configured")
	}
	if _, ok := m.cfg.Egress.(egressCapturer); !ok && sidecar(req.Containers) >= 0 {
		return nil, errdefs.New(errdefs.ErrUnavailable, "an egress sidecar needs the daemon's network, which is not configured")
	}
	for i, c := range req.Containers {
		field := fmt.Sprintf("containers[%d]", i)
		img, err := m.cfg.Images.Get(c.Image)
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				return nil, errdefs.Invalid(field+".image", "unknown image %q", c.Image)
			}
			return nil, err
		}
		g.images = append(g.images, img)
		r := c.Resources
		switch {
		case r.CPUs > res.CPUs && res.CPUs > 0:
			return nil, errdefs.Invalid(field+".resources.cpus", "%g is above the sandbox's %g", r.CPUs, res.CPUs)
		case r.MemoryBytes > res.MemoryBytes && res.MemoryBytes > 0:
			return nil, errdefs.Invalid(field+".resources.memory_bytes", "%d is above the sandbox's %d", r.MemoryBytes, res.MemoryBytes)
		case r.Pids > res.Pids && res.Pids > 0:
			return nil, errdefs.Invalid(field+".resources.pids", "%d is above the sandbox's %d", r.Pids, res.Pids)
		case r.DiskBytes > res.DiskBytes && res.DiskBytes > 0:
			return nil, errdefs.Invalid(field+".resources.disk_bytes", "%d is above the sandbox's %d", r.DiskBytes, res.DiskBytes)
		}
		vols := make([]api.VolumeMount, len(c.Mounts))
		for j, v := range c.Mounts {
			if name, ok := sharedVol[v.Name]; ok {
				v.Name = name
			} else if v.Name != "" {
				if m.cfg.Volumes == nil {
					return nil, errdefs.New(errdefs.ErrUnavailable, "volumes are not configured")
				}
				if _, err := m.cfg.Volumes.Get(v.Name); err != nil {
					return nil, errdefs.Invalid(fmt.Sprintf("%s.mounts[%d].name", field, j), "%q is neither a shared volume of the sandbox nor a volume", v.Name)
				}
			}
			vols[j] = v
		}
		g.vols = append(g.vols, vols)
	}
	return g, nil
}

// sharedByLabel labels a shared volume with its sandbox's id.
const sharedByLabel = "paddock.dev/shared-by"

// makeShared makes g's shared volumes; on failure it removes those it made.
func (m *Manager) makeShared(ctx context.Context, g *group) error {
	for i, v := range g.shared {
		if _, err := m.cfg.Volumes.Create(ctx, api.VolumeRequest{Name: v.Volume, SizeBytes: v.SizeBytes, Labels: map[string]string{sharedByLabel: strings.TrimSuffix(v.Volume, "-"+v.Name)}}, g.sharedFrom[v.Name]); err != nil {
			m.removeShared(g.shared[:i])
			return fmt.Errorf("making shared volume %s: %w", v.Name, err)
		}
	}
	return nil
}

// removeShared removes a sandbox's shared volumes, which nothing mounts any
// more.
func (m *Manager) removeShared(shared []api.SharedVolume) error {
	var errs []error
	for _, v := range shared {
		if err := m.cfg.Volumes.Remove(context.Background(), v.Volume); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, fmt.Errorf("removing shared volume %s: %w", v.Name, err))
		}
	}
	return errors.Join(errs...)
}

// imageEnv is a sandbox's or a container's environment: its image's, HOME,
// then env in key order.
func imageEnv(img *image.Image, env map[string]string) []string {
	out := append([]string(nil), img.Env...)
	out = append(out, "HOME=/root")
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

// memberSpec is the runtime's spec of container c (not the first) of
// sandbox rec, joining first.
func (m *Manager) memberSpec(rec *record, c api.Container, img *image.Image, first runtime.Instance, uidBase uint32) runtime.Spec {
	workdir := c.Workdir
	if workdir == "" {
		workdir = img.Workdir
	}
	res := c.Resources
	if res.DiskBytes == 0 {
		res.DiskBytes = m.cfg.Defaults.DiskBytes
	}
	return runtime.Spec{
		ID:        runtime.ContainerID(rec.ID, c.Name),
		Runtime:   rec.RuntimeName,
		Image:     img,
		Resources: res,
		Env:       imageEnv(img, c.Env),
		Workdir:   workdir,
		UIDBase:   uidBase,
		Held:      true,
		Join:      first,
	}
}

// startMembers starts the containers of b beside its first (b.inst,
// started, not yet activated), from its record; images are theirs by
// index (nil: looked up by the record's image id). It activates none. On
// failure it stops those it started (their disks stay, as the sandbox's)
// and leaves b.members empty.
func (m *Manager) startMembers(ctx context.Context, b *box, images []*image.Image, diskFrom map[string]string) (retErr error) {
	cs := b.rec.Containers
	defer func() {
		if retErr != nil {
			m.stopMembers(ctx, b)
		}
	}()
	for i := 1; i < len(cs); i++ {
		c := cs[i]
		mr := &b.rec.Members[i-1]
		var img *image.Image
		if images != nil {
			img = images[i]
		} else {
			var err error
			if img, err = m.cfg.Images.Get(imageRef(api.Sandbox{Image: c.Image, ImageID: c.ImageID})); err != nil {
				return fmt.Errorf("container %s: %w", c.Name, err)
			}
		}
		spec := m.memberSpec(&b.rec, c.Container, img, b.inst, mr.UIDBase)
		spec.DiskFrom = diskFrom[c.Name]
		var err error
		if spec.Mounts, err = m.mounts(ctx, spec.ID, mr.Volumes); err != nil {
			return fmt.Errorf("container %s: %w", c.Name, err)
		}
		if err := m.withControl(&spec, &b.rec, i); err != nil {
			if mr.UIDBase == 0 {
				m.releaseMounts(spec.ID, mr.Volumes)
			}
			return err
		}
		inst, err := m.startInstance(ctx, spec)
		if err != nil {
			if mr.UIDBase == 0 {
				m.releaseMounts(spec.ID, mr.Volumes)
			}
			return fmt.Errorf("starting container %s: %w", c.Name, err)
		}
		mb := &member{name: c.Name, inst: inst, guest: m.guestClient(inst)}
		b.members = append(b.members, mb)
		if mr.UIDBase == 0 {
			mr.UIDBase = inst.Info().UIDBase
		}
		mr.Runtime = inst.State()
		b.rec.Containers[i].State = api.StateRunning
		b.rec.Containers[i].Error = ""
	}
	// Before any command runs, so no connection escapes the sidecar.
	return m.captureEgress(b)
}

// egressCapturer is an Egress that can send a sandbox's outbound
// connections to its egress sidecar (the gateway).
type egressCapturer interface {
	// CaptureEgress sends sandbox id's outbound TCP connections to port
	// but those of host uids firstUID..lastUID.
	CaptureEgress(id string, port uint16, firstUID, lastUID uint32) error
}

// sidecar is the index of the egress sidecar among cs, or -1.
func sidecar(cs []api.Container) int {
	for i, c := range cs {
		if c.Role == api.RoleEgress {
			return i
		}
	}
	return -1
}

// captureEgress sends the outbound connections of b's containers to its
// egress sidecar, if it has one; its uid range is known once its guest
// has started (a sandbox started again may get another).
func (m *Manager) captureEgress(b *box) error {
	i := 0
	for i < len(b.rec.Containers) && b.rec.Containers[i].Role != api.RoleEgress {
		i++
	}
	if i == len(b.rec.Containers) {
		return nil
	}
	base := b.inst.Info().UIDBase
	if i > 0 {
		base = b.rec.Members[i-1].UIDBase
	}
	c, ok := m.cfg.Egress.(egressCapturer)
	if !ok {
		return errdefs.New(errdefs.ErrUnavailable, "an egress sidecar needs the daemon's network, which is not configured")
	}
	if err := c.CaptureEgress(b.rec.ID, uint16(b.rec.Containers[i].EgressPort), base, base+65535); err != nil {
		return fmt.Errorf("sending the sandbox's egress to container %s: %w", b.rec.Containers[i].Name, err)
	}
	return nil
}

// activateMembers brings b's members up (see activate) and has each
// watched.
func (m *Manager) activateMembers(b *box) {
	for _, mb := range b.members {
		if mb == nil {
			continue
		}
		activate(mb.inst)
		go mb.guest.DialAhead()
		m.watchMember(b, mb)
	}
}

// stopMembers ends b's members and releases their CPU and memory, keeping
// their disks: those running here, and whatever of the others' a guest
// that died or a daemon that died left (a cgroup, a socket).
func (m *Manager) stopMembers(ctx context.Context, b *box) error {
	for _, mb := range b.members {
		if mb == nil {
			continue
		}
		mb.inst.Kill()
		select {
		case <-mb.inst.Done():
		case <-ctx.Done():
		}
		mb.guest.Close()
	}
	b.members = nil
	var errs []error
	for _, mr := range b.rec.Members {
		if err := m.cfg.Runtime.Stop(ctx, runtime.ContainerID(b.rec.ID, mr.Name)); err != nil {
			errs = append(errs, fmt.Errorf("stopping container %s: %w", mr.Name, err))
		}
	}
	return errors.Join(errs...)
}

// removeMembers removes every trace of b's members (their guests dead or
// killed here) and what they mounted.
func (m *Manager) removeMembers(ctx context.Context, b *box) error {
	for _, mb := range b.members {
		if mb != nil {
			mb.inst.Kill()
			mb.guest.Close()
		}
	}
	b.members = nil
	for _, mr := range b.rec.Members {
		cid := runtime.ContainerID(b.rec.ID, mr.Name)
		if err := m.cfg.Runtime.Remove(ctx, cid); err != nil {
			return fmt.Errorf("removing container %s: %w", mr.Name, err)
		}
		m.releaseMounts(cid, mr.Volumes)
	}
	return nil
}

// watchMember records a member whose guest exits while its sandbox runs:
// the container is exited, with why; the sandbox and its other containers
// run on.
func (m *Manager) watchMember(b *box, mb *member) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-mb.inst.Done():
		case <-m.closed:
			return
		}
		why := "the container's init process exited"
		if a, ok := mb.inst.(runtime.Activating); ok {
			if err := a.StartErr(); err != nil {
				why = err.Error()
			}
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		i := b.memberIndex(mb)
		if i < 0 || b.rec.State != api.StateRunning {
			return // stopped, removed or started again meanwhile
		}
		c := &b.rec.Containers[i+1]
		c.State, c.Error, c.PID = api.StateStopped, why, 0
		m.log.Warn("container exited", "sandbox", b.rec.ID, "container", mb.name, "why", why)
		m.persistLocked(b)
		m.notify(b).Event(b.rec.ID, "lifecycle", "container "+mb.name+" exited", map[string]any{"container": mb.name, "error": why})
	}()
}

// memberIndex is mb's index in b.members, or -1.
func (b *box) memberIndex(mb *member) int {
	for i, x := range b.members {
		if x == mb {
			return i
		}
	}
	return -1
}

// containersView fills s.Containers' runtime details and states.
func (b *box) containersView(s *api.Sandbox) {
	if len(s.Containers) == 0 {
		return
	}
	cs := make([]api.ContainerStatus, len(s.Containers))
	copy(cs, s.Containers)
	for i := range cs {
		switch {
		case s.State != api.StateRunning:
			cs[i].State, cs[i].PID = s.State, 0
		case i == 0:
			if cs[i].State != api.StateFailed {
				cs[i].State = s.State
			}
			cs[i].Runtime = s.Runtime
		case i-1 < len(b.members) && b.members[i-1] != nil && cs[i].State == api.StateRunning:
			info := b.members[i-1].inst.Info()
			cs[i].Runtime = &info
		}
	}
	s.Containers = cs
}

// ContainerGuest is Guest for container name of sandbox id ("" or the
// first's name: the sandbox's own guest).
func (m *Manager) ContainerGuest(ctx context.Context, id, name string) (*guestapi.Client, error) {
	mb, err := m.memberOf(ctx, id, name, true)
	if err != nil || mb == nil {
		if err == nil {
			return m.Guest(ctx, id)
		}
		return nil, err
	}
	return mb.guest, nil
}

// ContainerDone is Done for container name of sandbox id.
func (m *Manager) ContainerDone(ctx context.Context, id, name string) (<-chan struct{}, error) {
	mb, err := m.memberOf(ctx, id, name, false)
	if err != nil || mb == nil {
		if err == nil {
			return m.Done(ctx, id)
		}
		return nil, err
	}
	return mb.inst.Done(), nil
}

// memberOf finds the running member name of sandbox id; nil, nil for the
// first container. wake resumes a paused sandbox first, as Guest does.
func (m *Manager) memberOf(ctx context.Context, id, name string, wake bool) (*member, error) {
	if name == "" {
		return nil, nil
	}
	b, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cs := b.rec.Containers
	i := 0
	for i < len(cs) && cs[i].Name != name {
		i++
	}
	switch {
	case i == len(cs):
		return nil, errdefs.NotFound("container", name)
	case i == 0:
		return nil, nil
	}
	if wake {
		if err := m.wakeLocked(ctx, b); err != nil {
			return nil, err
		}
	}
	if b.rec.State != api.StateRunning {
		return nil, notRunning(b)
	}
	// A failed one's guest runs: its files and processes can be looked at.
	if c := b.rec.Containers[i]; (c.State != api.StateRunning && c.State != api.StateFailed) || len(b.members) < i || b.members[i-1] == nil {
		return nil, errdefs.Conflict("container %s of sandbox %s is not running: %s", name, id, c.Error)
	}
	b.touch()
	return b.members[i-1], nil
}

// containerIndex is the index of b's container name ("" is the first's),
// or ErrNotFound. Its record's containers do not change after the
// create, so no lock is needed.
func (b *box) containerIndex(name string) (int, error) {
	if name == "" {
		return 0, nil
	}
	i := slices.IndexFunc(b.rec.Containers, func(c api.ContainerStatus) bool { return c.Name == name })
	if i < 0 {
		return 0, errdefs.NotFound("container", name)
	}
	return i, nil
}

// record puts g's containers and shared volumes in rec, the sandbox's.
func (g *group) record(rec *record) {
	rec.SharedVolumes = g.shared
	rec.Containers = make([]api.ContainerStatus, len(g.containers))
	rec.Members = make([]memberRecord, 0, len(g.containers)-1)
	for i, c := range g.containers {
		rec.Containers[i] = api.ContainerStatus{Container: c, ImageID: g.images[i].ID, State: api.StateCreating}
		rec.Containers[i].Image = g.images[i].Name
		if i > 0 {
			rec.Members = append(rec.Members, memberRecord{Name: c.Name, Volumes: g.vols[i]})
		}
	}
}

// startGroup starts a new sandbox b's members beside its first (started,
// not activated), activates them all and starts their commands. b.mu is
// held. On failure the caller unmakes b.
func (m *Manager) startGroup(ctx context.Context, b *box, g *group) error {
	if err := m.startMembers(ctx, b, g.images, g.diskFrom); err != nil {
		return err
	}
	activate(b.inst)
	m.activateMembers(b)
	if bg, ok := b.inst.(runtime.Backgrounder); ok && g.background {
		// The sandbox's group holds its members': all of it yields.
		if err := bg.SetBackground(true); err != nil {
			return err
		}
	}
	b.rec.Containers[0].State = api.StateRunning
	if err := m.startServices(ctx, b); err != nil {
		return err
	}
	m.superviseAll(b)
	m.claimSlots(b)
	return nil
}

// claimSlots records b's members' uid ranges, which the runtime took
// for them as they started, as b's.
func (m *Manager) claimSlots(b *box) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, mr := range b.rec.Members {
		if mr.UIDBase != 0 {
			m.slots[m.slotOf(mr.UIDBase)] = b.rec.ID
		}
	}
}

// unmake removes every trace of a sandbox b whose create failed before it
// was answered: its guests, their disks and uid ranges, its mounts. b.mu
// is held.
func (m *Manager) unmake(b *box) {
	ctx := context.Background()
	b.stopping = true
	b.inst.Kill()
	<-b.inst.Done()
	if err := m.removeMembers(ctx, b); err != nil {
		m.log.Warn("removing a failed sandbox's containers", "sandbox", b.rec.ID, "err", err)
	}
	for _, mr := range b.rec.Members {
		if mr.UIDBase != 0 {
			m.Free(mr.UIDBase)
		}
	}
	if err := m.cfg.Runtime.Remove(ctx, b.rec.ID); err != nil {
		m.log.Warn("removing a failed sandbox", "sandbox", b.rec.ID, "err", err)
	}
	m.releaseMounts(b.rec.ID, b.rec.Volumes)
	m.forgetControls(b.rec.ID)
	m.forget(b.rec.ID)
}

// dropShared removes the shared volumes of a create that failed.
func (m *Manager) dropShared(g *group) {
	if g == nil {
		return
	}
	if err := m.removeShared(g.shared); err != nil {
		m.log.Warn("removing a failed sandbox's shared volumes", "err", err)
	}
}

// restoreMembers re-attaches a re-attached sandbox's members after a
// daemon restart; one whose guest is gone is recorded stopped. b.mu is
// held.
func (m *Manager) restoreMembers(ctx context.Context, b *box) {
	b.members = make([]*member, len(b.rec.Members))
	changed := false
	for i, mr := range b.rec.Members {
		c := &b.rec.Containers[i+1]
		if c.State != api.StateRunning {
			continue
		}
		cid := runtime.ContainerID(b.rec.ID, mr.Name)
		inst, err := m.cfg.Runtime.Restore(ctx, cid, runtime.RestoreSpec{State: mr.Runtime, Resources: c.Resources, Frozen: b.rec.State == api.StateFrozen})
		if err != nil {
			m.log.Warn("container did not survive", "sandbox", b.rec.ID, "container", mr.Name, "err", err)
			if err := m.cfg.Runtime.Stop(ctx, cid); err != nil {
				m.log.Warn("releasing container", "sandbox", b.rec.ID, "container", mr.Name, "err", err)
			}
			c.State, c.Error, c.PID = api.StateStopped, "the container ended while the daemon was down", 0
			changed = true
			continue
		}
		mb := &member{name: mr.Name, inst: inst, guest: m.guestClient(inst)}
		b.members[i] = mb
		m.watchMember(b, mb)
	}
	if changed {
		m.persistLocked(b)
	}
}

// group reports whether b has containers beside its first. Its record
// does not change after the create, so no lock is needed.
func (b *box) group() bool { return len(b.rec.Members) > 0 }

// ContainerKey is how the exec log names container name of sandbox id:
// "" for its first, whether a request named it or not, so that one
// process has one name. A name the sandbox has no container of is
// ErrNotFound.
func (m *Manager) ContainerKey(id, name string) (string, error) {
	if name == "" {
		return "", nil
	}
	b, err := m.lookup(id)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.IndexFunc(b.rec.Containers, func(c api.ContainerStatus) bool { return c.Name == name })
	switch {
	case i < 0:
		return "", errdefs.NotFound("container", name)
	case i == 0:
		return "", nil
	}
	return name, nil
}
