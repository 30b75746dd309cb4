package api

import "time"

// Image describes an image sandboxes can be made from: the built-in
// "host" image or an OCI image imported or pulled into the daemon.
type Image struct {
	// Name is the name it was asked for, or its first name; empty for an
	// OCI image no name points at.
	Name string `json:"name"`
	// BuiltIn marks the host image, which cannot be removed.
	BuiltIn bool `json:"builtin,omitempty"`
	// Names are every name pointing at it ("repo:tag", with the registry
	// when it came from one).
	Names []string `json:"names,omitempty"`
	// ID is the digest of the image's config ("sha256:..."); for the
	// built-in image, a digest of its skeleton.
	ID string `json:"id"`
	// Digest is the manifest's digest as a registry names it.
	Digest string `json:"digest,omitempty"`
	// RepoDigests are the pinned references it was pulled as.
	RepoDigests []string `json:"repo_digests,omitempty"`
	Platform    string   `json:"platform,omitempty"`
	// SizeBytes is the unpacked size of its layers (a layer shared with
	// other images counts in each).
	SizeBytes int64 `json:"size_bytes"`
	// Layers is the number of read-only layers.
	Layers    int         `json:"layers"`
	CreatedAt *time.Time  `json:"created_at,omitempty"`
	StoredAt  *time.Time  `json:"stored_at,omitempty"`
	Config    ImageConfig `json:"config"`
	// UsedBy lists "sandbox <id>" and "snapshot <id>" made from the image
	// (inspect only).
	UsedBy []string `json:"used_by,omitempty"`
}

// ImageConfig is an image's defaults. A sandbox made from it starts with
// Env (a PATH is added when the image has none) and Workdir (default /);
// User, Entrypoint and Cmd are reported, not applied: commands run as root
// unless an exec names a user.
type ImageConfig struct {
	Env        []string          `json:"env,omitempty"`
	Workdir    string            `json:"workdir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// PullRequest is the body of POST /v1/images/pull.
type PullRequest struct {
	// Reference is host[:port]/repository[:tag] or
	// host[:port]/repository@sha256:<hex>. The registry must be named.
	Reference string `json:"ref"`
	// Digest pins the manifest (or index) to "sha256:<hex>": the pull
	// fails unless the registry serves exactly that.
	Digest string `json:"digest,omitempty"`
	// Username and Password, or Token (a registry bearer token), are the
	// registry's credentials. They are used for this pull only and never
	// stored.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	Token    string `json:"token,omitempty"`
	// Insecure allows plain HTTP to the registry. It is honoured for
	// loopback registries, and for others only when the daemon allows
	// insecure registries.
	Insecure bool `json:"insecure,omitempty"`
	// Platform picks an image of a multi-platform index
	// ("os/arch[/variant]"); default linux on the daemon's architecture.
	Platform string `json:"platform,omitempty"`
}

// PullEvent is one line of a pull's progress stream
// (Accept: application/x-ndjson). The last line carries Image or Error.
type PullEvent struct {
	// Status is "resolving", "downloading" or "done".
	Status string `json:"status,omitempty"`
	// Bytes is what was received from the registry so far.
	Bytes int64  `json:"bytes,omitempty"`
	Image *Image `json:"image,omitempty"`
	Error *Error `json:"error,omitempty"`
}
