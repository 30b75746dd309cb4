package sandbox

import (
	"fmt"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// A container whose spec names others in Controls (api.Container.Controls)
// drives them without the host: the daemon serves it a control socket,
// bound read-only into that container alone at api.ControlDir, on which
// the API reaches those containers of its own sandbox and nothing else.
// The socket is the credential: the sandbox's other containers share its
// network namespace (where an abstract socket would be theirs too) but not
// its mount namespace, so no other process can reach the socket's file.

// ControlScope is what one control socket reaches.
type ControlScope struct {
	Sandbox string
	// Container holds the socket; Controls are the containers it
	// reaches; First is the sandbox's first container, the one a call
	// that names none addresses.
	Container string
	Controls  []string
	First     string
}

// Controls serves control sockets; the daemon's API server implements it.
type Controls interface {
	// Open serves sc's control socket in a host directory of its own,
	// which it returns; opening one open already returns the same.
	Open(sc ControlScope) (dir string, err error)
	// Forget closes sandbox id's control sockets and removes their
	// directories.
	Forget(id string)
}

// SetControls sets what serves containers' control sockets; without it a
// create whose containers name Controls is refused.
func (m *Manager) SetControls(c Controls) { m.ctl = c }

// validateControls checks the containers' Controls: each names another
// container of the sandbox, once.
func validateControls(cs []api.Container) error {
	names := map[string]bool{}
	for _, c := range cs {
		names[c.Name] = true
	}
	for i, c := range cs {
		seen := map[string]bool{}
		for j, n := range c.Controls {
			field := fmt.Sprintf("containers[%d].controls[%d]", i, j)
			switch {
			case n == c.Name:
				return errdefs.Invalid(field, "%q is the container itself, which runs its own commands", n)
			case !names[n]:
				return errdefs.Invalid(field, "%q is not a container of the sandbox", n)
			case seen[n]:
				return errdefs.Invalid(field, "%q is named twice", n)
			}
			seen[n] = true
		}
	}
	return nil
}

// controlFor opens container i of rec's control socket, if it controls
// others, and returns the mount that binds it in and the environment
// that points the SDK and CLI at it.
func (m *Manager) controlFor(rec *record, i int) ([]runtime.Mount, []string, error) {
	if i >= len(rec.Containers) || len(rec.Containers[i].Controls) == 0 {
		return nil, nil, nil
	}
	if m.ctl == nil {
		return nil, nil, errdefs.New(errdefs.ErrUnavailable, "this daemon serves no control sockets")
	}
	c := rec.Containers[i]
	dir, err := m.ctl.Open(ControlScope{Sandbox: rec.ID, Container: c.Name, Controls: c.Controls, First: rec.Containers[0].Name})
	if err != nil {
		return nil, nil, fmt.Errorf("opening container %s's control socket: %w", c.Name, err)
	}
	return []runtime.Mount{{Source: dir, Dest: api.ControlDir, ReadOnly: true}},
		[]string{"PADDOCK_HOST=unix://" + api.ControlSocket, "PADDOCK_SANDBOX=" + rec.ID}, nil
}

// withControl adds container i's control socket to spec (see controlFor).
func (m *Manager) withControl(spec *runtime.Spec, rec *record, i int) error {
	mounts, env, err := m.controlFor(rec, i)
	if err != nil {
		return err
	}
	spec.Mounts = append(spec.Mounts, mounts...)
	spec.Env = append(spec.Env, env...)
	return nil
}

// reopenControls serves a re-attached sandbox's control sockets again
// (a restarted daemon): the containers have their directories bound
// already, and the sockets come back in them.
func (m *Manager) reopenControls(b *box) {
	for i := range b.rec.Containers {
		if _, _, err := m.controlFor(&b.rec, i); err != nil {
			m.log.Warn("reopening a control socket", "sandbox", b.rec.ID, "err", err)
		}
	}
}

// forgetControls closes sandbox id's control sockets.
func (m *Manager) forgetControls(id string) {
	if m.ctl != nil {
		m.ctl.Forget(id)
	}
}
