package sandbox

// The manager's domains besides sandboxes each have a service, a small
// value over the same Manager (their state is shared: a create holds its
// image, a snapshot holds its sandbox). Every service names its calls the
// same way (List, Get, Create, Remove, and verbs for the rest), and every
// call that may block takes a context.

// Images is the manager's image service: the built-in image and OCI
// images, removed only when nothing uses them.
type Images struct{ m *Manager }

// Images returns the image service.
func (m *Manager) Images() Images { return Images{m} }

// Volumes is the manager's service of named volumes.
type Volumes struct{ m *Manager }

// Volumes returns the volume service.
func (m *Manager) Volumes() Volumes { return Volumes{m} }

// Snapshots is the manager's snapshot service: captures of sandboxes'
// disks and of directories.
type Snapshots struct{ m *Manager }

// Snapshots returns the snapshot service.
func (m *Manager) Snapshots() Snapshots { return Snapshots{m} }

// Templates is the manager's template service: builds, their records
// and their warm pools.
type Templates struct{ m *Manager }

// Templates returns the template service.
func (m *Manager) Templates() Templates { return Templates{m} }

// Pools is the manager's service of warm pools.
type Pools struct{ m *Manager }

// Pools returns the pool service.
func (m *Manager) Pools() Pools { return Pools{m} }
