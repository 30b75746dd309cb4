package api

// Budget caps what a sandbox may use over its life. Zero fields are not
// capped.
type Budget struct {
	CPUSeconds     float64 `json:"cpu_seconds,omitempty"`
	WallSeconds    int64   `json:"wall_seconds,omitempty"`
	EgressBytes    int64   `json:"egress_bytes,omitempty"`
	EgressRequests int64   `json:"egress_requests,omitempty"`
	// Cost caps the cost computed from the daemon's prices.
	Cost float64 `json:"cost,omitempty"`
	// WarnAt is the fraction of a budget at which a warning event fires;
	// 0 means 0.8.
	WarnAt float64 `json:"warn_at,omitempty"`
	// Action is what happens when a budget is reached: "pause" (the
	// default), "kill", "cut_network" or "none".
	Action string `json:"action,omitempty"`
}

// Autoscale lets paddock grow a sandbox's memory and CPU limits when it
// nears them and shrink them back when it is idle, within these bounds.
type Autoscale struct {
	MinMemoryBytes int64   `json:"min_memory_bytes,omitempty"`
	MaxMemoryBytes int64   `json:"max_memory_bytes,omitempty"`
	MinCPUs        float64 `json:"min_cpus,omitempty"`
	MaxCPUs        float64 `json:"max_cpus,omitempty"`
}

// UpdateRequest is the body of POST /v1/sandboxes/{id}/update: new limits
// for a running sandbox, applied without restarting anything. Zero fields
// are left as they are; disk cannot change.
type UpdateRequest struct {
	Resources Resources  `json:"resources"`
	Autoscale *Autoscale `json:"autoscale,omitempty"`
	Budget    *Budget    `json:"budget,omitempty"`
}
