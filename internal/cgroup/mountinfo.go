package cgroup

import (
	"strings"

	"github.com/paddock-dev/paddock/internal/mountinfo"
)

// v1Controllers are the only v1 controllers paddock uses.
var v1Controllers = []string{"cpu", "cpuacct", "memory", "pids", "freezer"}

// cgroupMounts is where the hierarchies are mounted.
type cgroupMounts struct {
	v1 map[string]string // controller name → mount point, for v1Controllers only
	v2 string            // the cgroup2 mount point, "" if none
}

// parseMountinfo finds the cgroup mounts in the contents of
// /proc/self/mountinfo (proc(5)). Where a hierarchy is mounted more than
// once, the first mount wins; for cgroup2, a mount of the hierarchy's root
// wins over a mount of a subtree.
func parseMountinfo(b []byte) cgroupMounts {
	m := cgroupMounts{v1: make(map[string]string)}
	v2Root := false
	for len(b) > 0 {
		var line []byte
		line, b = cutLine(b)
		mnt, ok := mountinfo.Parse(string(line))
		if !ok {
			continue
		}
		switch mnt.FSType {
		case "cgroup2":
			if m.v2 == "" || (!v2Root && mnt.Root == "/") {
				m.v2, v2Root = mnt.Point, mnt.Root == "/"
			}
		case "cgroup":
			for _, opt := range strings.Split(mnt.SuperOpts, ",") {
				for _, c := range v1Controllers {
					if opt == c {
						if _, seen := m.v1[c]; !seen {
							m.v1[c] = mnt.Point
						}
					}
				}
			}
		}
	}
	return m
}
