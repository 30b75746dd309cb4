package sandbox

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/snapshot"
	"github.com/paddock-dev/paddock/internal/volume"
)

var (
	labelKeyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)
)

// Bounds on what a request may ask for.
const (
	minMemory = 16 << 20
	minDisk   = 16 << 20
	maxDisk   = 16 << 40
	minPids   = 16 // the sandbox's init takes about ten
	// maxPids is the kernel's ceiling on pids (PID_MAX_LIMIT on 64-bit):
	// a pids.max above it is refused when the cgroup is written.
	maxPids     = 1 << 22
	maxTimeout  = 30 * 24 * time.Hour
	maxLabels   = 64
	maxLabelVal = 256
)

func validateCreate(req *api.CreateRequest, hostCPUs int) error {
	if err := reqcheck.Env("env", req.Env); err != nil {
		return err
	}
	if err := reqcheck.Path("workdir", req.Workdir); err != nil {
		return err
	}
	if err := validateLimits(req.Resources, req.Budget, req.Autoscale, hostCPUs); err != nil {
		return err
	}
	switch {
	case req.TimeoutSeconds < 0 || time.Duration(req.TimeoutSeconds)*time.Second > maxTimeout:
		return errdefs.Invalid("timeout_seconds", "%d is outside 0..%d", req.TimeoutSeconds, int64(maxTimeout/time.Second))
	case req.OnTimeout != "" && req.OnTimeout != api.TimeoutRemove && req.OnTimeout != api.TimeoutPause:
		return errdefs.Invalid("on_timeout", "%q is neither %q nor %q", req.OnTimeout, api.TimeoutRemove, api.TimeoutPause)
	case req.AutoPauseSeconds < 0 || time.Duration(req.AutoPauseSeconds)*time.Second > maxTimeout:
		return errdefs.Invalid("auto_pause_seconds", "%d is outside 0..%d", req.AutoPauseSeconds, int64(maxTimeout/time.Second))
	}
	if len(req.From) > 256 || strings.ContainsRune(req.From, 0) {
		return errdefs.Invalid("from", "not a snapshot id, template or image name")
	}
	if err := validateVolumes(req.Volumes); err != nil {
		return err
	}
	if err := validateContainers(req); err != nil {
		return err
	}
	return ValidateLabels(req.Labels)
}

// validateLimits checks a sandbox's limits, budget and autoscale bounds:
// the one check for a create and an update alike (zero values are the
// defaults, or on an update what the sandbox has).
func validateLimits(r api.Resources, b *api.Budget, a *api.Autoscale, hostCPUs int) error {
	switch {
	case r.CPUs < 0 || (r.CPUs > 0 && r.CPUs < 0.01):
		return errdefs.Invalid("resources.cpus", "%g is below 0.01", r.CPUs)
	case r.CPUs > float64(hostCPUs):
		return errdefs.Invalid("resources.cpus", "%g is more than the host's %d", r.CPUs, hostCPUs)
	case r.MemoryBytes < 0 || (r.MemoryBytes > 0 && r.MemoryBytes < minMemory):
		return errdefs.Invalid("resources.memory_bytes", "%d is below the minimum of 16 MiB", r.MemoryBytes)
	case r.Pids < 0 || (r.Pids > 0 && r.Pids < minPids):
		return errdefs.Invalid("resources.pids", "%d is below the minimum of %d", r.Pids, minPids)
	case r.Pids > maxPids:
		return errdefs.Invalid("resources.pids", "%d is above the maximum of %d", r.Pids, maxPids)
	case r.DiskBytes < 0 || (r.DiskBytes > 0 && r.DiskBytes < minDisk):
		return errdefs.Invalid("resources.disk_bytes", "%d is below the minimum of 16 MiB", r.DiskBytes)
	case r.DiskBytes > maxDisk:
		return errdefs.Invalid("resources.disk_bytes", "%d is above the maximum of 16 TiB", r.DiskBytes)
	}
	if err := validateBudget(b); err != nil {
		return err
	}
	return validateAutoscale(a, hostCPUs)
}

// maxVolumes bounds the volumes one sandbox mounts.
const maxVolumes = 32

// validateVolumes checks volume mounts: each names a volume or a
// directory snapshot and an absolute, clean path that is not the root, not
// in a kernel filesystem and not used twice.
func validateVolumes(vols []api.VolumeMount) error {
	if len(vols) > maxVolumes {
		return errdefs.Invalid("volumes", "more than %d mounts", maxVolumes)
	}
	seen := map[string]bool{}
	for i, v := range vols {
		field := fmt.Sprintf("volumes[%d]", i)
		switch {
		case (v.Name == "") == (v.Snapshot == ""):
			return errdefs.Invalid(field, "needs exactly one of name and snapshot")
		case v.Name != "":
			if err := volume.ValidName(v.Name); err != nil {
				return errdefs.Invalid(field+".name", "%q is not a volume name", v.Name)
			}
		case !snapshot.IsID(v.Snapshot):
			return errdefs.Invalid(field+".snapshot", "%q is not a snapshot id", v.Snapshot)
		}
		if v.Path == "" {
			return errdefs.Invalid(field+".path", "is required")
		}
		if err := reqcheck.Path(field+".path", v.Path); err != nil {
			return err
		}
		p := strings.TrimSuffix(v.Path, "/")
		if p == "" {
			return errdefs.Invalid(field+".path", "cannot be the root")
		}
		for _, k := range []string{"/proc", "/sys", "/dev"} {
			if p == k || strings.HasPrefix(p, k+"/") {
				return errdefs.Invalid(field+".path", "%s is in %s", p, k)
			}
		}
		if seen[p] {
			return errdefs.Invalid(field+".path", "%s is mounted twice", p)
		}
		seen[p] = true
	}
	return nil
}

// ValidateLabels checks label keys and values.
func ValidateLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return errdefs.Invalid("labels", "more than %d labels", maxLabels)
	}
	for k, v := range labels {
		if !labelKeyPattern.MatchString(k) {
			return errdefs.Invalid("labels", "%q is not a valid label key", k)
		}
		if len(v) > maxLabelVal || strings.ContainsRune(v, 0) {
			return errdefs.Invalid("labels", "value of %q is too long or contains NUL", k)
		}
	}
	return nil
}

func validateBudget(b *api.Budget) error {
	if b == nil {
		return nil
	}
	switch {
	case b.CPUSeconds < 0:
		return errdefs.Invalid("budget.cpu_seconds", "%g is negative", b.CPUSeconds)
	case b.WallSeconds < 0:
		return errdefs.Invalid("budget.wall_seconds", "%d is negative", b.WallSeconds)
	case b.EgressBytes < 0:
		return errdefs.Invalid("budget.egress_bytes", "%d is negative", b.EgressBytes)
	case b.EgressRequests < 0:
		return errdefs.Invalid("budget.egress_requests", "%d is negative", b.EgressRequests)
	case b.Cost < 0:
		return errdefs.Invalid("budget.cost", "%g is negative", b.Cost)
	case b.WarnAt < 0 || b.WarnAt > 1:
		return errdefs.Invalid("budget.warn_at", "%g is outside 0..1", b.WarnAt)
	}
	switch b.Action {
	case "", "pause", "kill", "cut_network", "none":
	default:
		return errdefs.Invalid("budget.action", "%q is not pause, kill, cut_network or none", b.Action)
	}
	return nil
}

func validateAutoscale(a *api.Autoscale, hostCPUs int) error {
	if a == nil {
		return nil
	}
	switch {
	case a.MinMemoryBytes < 0 || (a.MinMemoryBytes > 0 && a.MinMemoryBytes < minMemory):
		return errdefs.Invalid("autoscale.min_memory_bytes", "%d is below the minimum of 16 MiB", a.MinMemoryBytes)
	case a.MaxMemoryBytes < a.MinMemoryBytes:
		return errdefs.Invalid("autoscale.max_memory_bytes", "%d is below min_memory_bytes", a.MaxMemoryBytes)
	case a.MinCPUs < 0 || a.MaxCPUs < a.MinCPUs:
		return errdefs.Invalid("autoscale.max_cpus", "%g..%g is not a range", a.MinCPUs, a.MaxCPUs)
	case a.MaxCPUs > float64(hostCPUs):
		return errdefs.Invalid("autoscale.max_cpus", "%g is more than the host's %d", a.MaxCPUs, hostCPUs)
	}
	return nil
}
