package api

import "time"

// TemplateSpec describes a template: an image plus setup steps. It is the
// JSON body of POST /v1/templates, or the content of a paddock.yaml.
type TemplateSpec struct {
	// Name is 1 to 64 characters of [a-z0-9._-], starting with a letter
	// or digit; it must not name an image.
	Name string `json:"name"`
	// Image is the base image; default "host".
	Image string `json:"image,omitempty"`
	// Steps run in order; each one's result is cached by its content.
	// A template of containers has none.
	Steps []TemplateStep `json:"steps"`
	// Containers make it a group template: a sandbox of these containers
	// (as CreateRequest.Containers; no image and no steps), whose warm
	// pool keeps groups with every service started and its readiness
	// check passed, so that a create from it is a hand-out.
	Containers []Container `json:"containers,omitempty"`
	// SharedVolumes are the group's shared volumes (as
	// CreateRequest.SharedVolumes).
	SharedVolumes []SharedVolume `json:"shared_volumes,omitempty"`
	// Policy is what the build's run steps may reach on the network;
	// absent means nothing. Sandboxes made from the template keep it
	// unless their create sets one.
	Policy *Policy `json:"policy,omitempty"`
	// Resources are the build sandbox's limits and the default limits of
	// sandboxes made from the template.
	Resources Resources `json:"resources,omitempty"`
	// Warm is how many sandboxes of the template to keep ready (created,
	// idle and frozen), so that a create is a hand-out.
	Warm int `json:"warm,omitempty"`
	// Runtime is the runtime of the build and of sandboxes made from the
	// template unless their create names one (CreateRequest.Runtime).
	// The warm pool is native's: a gvisor template's creates build their
	// sandbox.
	Runtime string `json:"runtime,omitempty"`
}

// TemplateStep is one setup step: exactly one of its fields is set.
type TemplateStep struct {
	// Run is a shell command (run with /bin/sh -c).
	Run string `json:"run,omitempty"`
	// Copy puts files from the build context (or inline content) into the
	// sandbox.
	Copy *TemplateCopy `json:"copy,omitempty"`
	// Env adds variables for the later steps and the sandboxes made from
	// the template.
	Env map[string]string `json:"env,omitempty"`
	// Workdir sets (and creates) the working directory of the later steps
	// and of the sandboxes made from the template.
	Workdir string `json:"workdir,omitempty"`
}

// TemplateCopy copies a file or a directory into the sandbox.
type TemplateCopy struct {
	// Src is a path in the build context (a file or a directory, whose
	// contents are copied); Content, instead, is a file's bytes inline.
	Src     string  `json:"src,omitempty"`
	Content *string `json:"content,omitempty"`
	// Dest is an absolute path in the sandbox: the file's path, or the
	// directory that receives a directory's contents. A Dest ending in
	// "/" receives a file under its own name.
	Dest string `json:"dest"`
	// Mode is the mode of an inline file (default 0644).
	Mode *FileMode `json:"mode,omitempty"`
}

// Template describes a built template.
type Template struct {
	Name  string `json:"name"`
	Image string `json:"image"`
	// Snapshot is the final step's snapshot: creating a sandbox from the
	// template is creating from it.
	Snapshot string `json:"snapshot"`
	// Env and Workdir are what the steps set; sandboxes start with them.
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	Resources Resources         `json:"resources"`
	Policy    *Policy           `json:"policy,omitempty"`
	Warm      int               `json:"warm,omitempty"`
	// WarmReady is how many sandboxes of the template are ready now.
	WarmReady int                  `json:"warm_ready"`
	Steps     []TemplateStepResult `json:"steps"`
	Spec      TemplateSpec         `json:"spec"`
	CreatedAt time.Time            `json:"created_at"`
	// BuildMS is how long the last build took; CacheHits and CacheMisses
	// count its steps that were reused and run.
	BuildMS     float64 `json:"build_ms"`
	CacheHits   int     `json:"cache_hits"`
	CacheMisses int     `json:"cache_misses"`
}

// TemplateStepResult is one built step.
type TemplateStepResult struct {
	// Key is the step's cache key: a hash of the previous step's key and
	// this step's content (with copied files' bytes).
	Key      string `json:"key"`
	Snapshot string `json:"snapshot"`
	// Cached says the last build reused it.
	Cached bool `json:"cached"`
}

// TemplateEvent is one line of a build's log (application/x-ndjson).
// Exactly one of its groups is set.
type TemplateEvent struct {
	// Step (1-based) of Steps is starting: Cache is "hit" or "miss".
	Step   int    `json:"step,omitempty"`
	Steps  int    `json:"steps,omitempty"`
	Action string `json:"action,omitempty"`
	Cache  string `json:"cache,omitempty"`
	// Stream ("stdout" or "stderr") and Data are output of a run step.
	Stream string `json:"stream,omitempty"`
	Data   string `json:"data,omitempty"`
	// Template is the result; it is the last line of a build that worked.
	Template *Template `json:"template,omitempty"`
	// Error ends a build that failed.
	Error *Error `json:"error,omitempty"`
}

// Pools is the body of GET /v1/pools: ready sandboxes by pool ("image:NAME"
// or "template:NAME") and the size each is kept at.
type Pools struct {
	Ready  map[string]int `json:"ready"`
	Target map[string]int `json:"target"`
}

// PoolRequest is the body of PUT /v1/pools: the pool ("image:NAME" or
// "template:NAME") and how many sandboxes to keep ready; 0 removes it.
type PoolRequest struct {
	Name string `json:"name"`
	Size int    `json:"size"`
}

// Pool is one warm pool: its name ("image:NAME" or "template:NAME"), the
// size it is kept at and the sandboxes ready now.
type Pool struct {
	Name   string `json:"name"`
	Target int    `json:"target"`
	Ready  int    `json:"ready"`
}
