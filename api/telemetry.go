package api

import "time"

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

// Self is what a sandbox may know about itself: GET
// http://paddock.internal/v1/self from inside it, and the file
// /run/paddock/self.json there. Nothing in it names another sandbox.
type Self struct {
	Sandbox string `json:"sandbox"`
	// Limits are the limits in force now, the autoscaler's included; a
	// zero field has no limit.
	Limits *Resources `json:"limits,omitempty"`
	// Usage is the latest sample; nil until the sandbox is sampled.
	Usage *Sample `json:"usage,omitempty"`
	// Budgets are its budgets with what remains of each.
	Budgets []BudgetLine `json:"budgets,omitempty"`
	// Autoscale is set for an autoscaled sandbox: the bounds it may move in.
	Autoscale *Autoscale `json:"autoscale,omitempty"`
	// Policy is what it may reach on the network.
	Policy Policy `json:"policy"`
	// Denials are recent connections and requests the policy refused,
	// newest last.
	Denials []Denial `json:"denials"`
}

// Denial is a connection, request or name the egress policy refused, as
// the sandbox sees it: the reason, and the rule that would allow it.
type Denial struct {
	Time time.Time `json:"time"`
	// Kind is how it was refused: "dns", "tcp", "tls" or "http".
	Kind   string `json:"kind"`
	Host   string `json:"host,omitempty"`
	IP     string `json:"ip,omitempty"`
	Port   uint16 `json:"port,omitempty"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	Reason string `json:"reason"`
	// Rule is the rule that decided, if one did.
	Rule string `json:"rule,omitempty"`
	// Suggest is the policy flag that would allow it ("--allow HOST").
	Suggest string `json:"suggest,omitempty"`
}
