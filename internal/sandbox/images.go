package sandbox

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/storage/image"
	"github.com/paddock-dev/paddock/internal/storage/oci"
)

// imageState is the manager's part in images: removal against use.
type imageState struct {
	// mu is held for reading by a create from the moment it resolves its
	// image until the sandbox is recorded, and for writing by a removal,
	// so that an image cannot go while a sandbox is being made from it.
	mu sync.RWMutex
}

var errNoOCI = errdefs.New(errdefs.ErrUnavailable, "OCI images are not configured")

// imageRef names the exact image a sandbox was made from: an OCI image by
// its ID (its name may have moved to another image since), the built-in
// image by name.
func imageRef(sb api.Sandbox) string {
	if strings.HasPrefix(sb.ImageID, "sha256:") {
		return sb.ImageID
	}
	return sb.Image
}

func (m *Manager) ociStore() (*oci.Store, error) {
	if o := m.cfg.Images.OCI(); o != nil {
		return o, nil
	}
	return nil, errNoOCI
}

// List lists the built-in image and every OCI image.
func (s Images) List(ctx context.Context) ([]api.Image, error) {
	m := s.m
	host, err := m.cfg.Images.Get(image.HostImage)
	if err != nil {
		return nil, err
	}
	out := []api.Image{hostView(host)}
	o := m.cfg.Images.OCI()
	if o == nil {
		return out, nil
	}
	list, err := o.List()
	if err != nil {
		return nil, err
	}
	for _, img := range list {
		out = append(out, ociView(img))
	}
	return out, nil
}

// Get describes one image and who uses it.
func (s Images) Get(ctx context.Context, ref string) (api.Image, error) {
	m := s.m
	if ref == "" || ref == image.HostImage {
		host, err := m.cfg.Images.Get(image.HostImage)
		if err != nil {
			return api.Image{}, err
		}
		return hostView(host), nil
	}
	o, err := m.ociStore()
	if err != nil {
		return api.Image{}, err
	}
	img, err := o.Get(ref)
	if err != nil {
		return api.Image{}, err
	}
	v := ociView(img)
	v.UsedBy = m.imageUsers(o, img.ID)
	return v, nil
}

// Import stores the image in an archive (`docker save` or an OCI
// layout, optionally gzip-compressed) under name, or under the names the
// archive gives it.
func (s Images) Import(ctx context.Context, r io.Reader, name string) (api.Image, error) {
	m := s.m
	o, err := m.ociStore()
	if err != nil {
		return api.Image{}, err
	}
	img, err := o.Import(ctx, r, name)
	if err != nil {
		return api.Image{}, err
	}
	return ociView(img), nil
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Pull fetches an image from its registry. progress, when set, is
// told the bytes received so far as they arrive.
func (s Images) Pull(ctx context.Context, req api.PullRequest, progress func(int64)) (api.Image, error) {
	m := s.m
	o, err := m.ociStore()
	if err != nil {
		return api.Image{}, err
	}
	ref, tag, err := pullTarget(req)
	if err != nil {
		return api.Image{}, err
	}
	if req.Token != "" && (req.Username != "" || req.Password != "") {
		return api.Image{}, errdefs.Invalid("token", "give a token or a username and password, not both")
	}
	loopbackOnly := req.Insecure && !m.cfg.AllowInsecureRegistries
	if loopbackOnly {
		if host, ok := loopbackRegistry(ref); !ok {
			return api.Image{}, errdefs.Invalid("insecure", "plain HTTP is allowed only to loopback registries (%s is not one); the daemon allows more with --allow-insecure-registries", host)
		}
	}
	opts := oci.PullOptions{
		Username: req.Username,
		Password: req.Password,
		Insecure: req.Insecure,
		Platform: req.Platform,
	}
	if req.Token != "" {
		opts.Auth = authn.FromConfig(authn.AuthConfig{RegistryToken: req.Token})
	}
	if progress == nil {
		progress = func(int64) {}
	}
	opts.Transport = &pullTransport{next: remote.DefaultTransport, report: progress, httpLoopbackOnly: loopbackOnly}
	img, err := o.Pull(ctx, ref, opts)
	if err != nil {
		return api.Image{}, err
	}
	if tag != "" {
		// Named only now that the pinned bytes were verified and stored.
		if img, err = o.Tag(img.ID, tag); err != nil {
			return api.Image{}, err
		}
	}
	m.log.Info("image pulled", "reference", ref, "id", img.ID, "layers", len(img.Layers))
	return ociView(img), nil
}

// pullTarget returns what to pull and, for a pull pinned by req.Digest,
// the tag to name the image after (the pull itself is by digest).
func pullTarget(req api.PullRequest) (ref, tag string, err error) {
	ref = strings.TrimSpace(req.Reference)
	if ref == "" {
		return "", "", errdefs.Invalid("reference", "required: host[:port]/repository[:tag]")
	}
	if req.Digest == "" {
		return ref, "", nil
	}
	if !digestRE.MatchString(req.Digest) {
		return "", "", errdefs.Invalid("digest", "%q is not sha256:<64 hex digits>", req.Digest)
	}
	r, err := name.ParseReference(ref, name.WithDefaultRegistry("no-registry.invalid"))
	if err != nil {
		return "", "", errdefs.Invalid("reference", "%q: %v", ref, err)
	}
	switch r := r.(type) {
	case name.Digest:
		if r.DigestStr() != req.Digest {
			return "", "", errdefs.Invalid("digest", "%s differs from the reference's digest %s", req.Digest, r.DigestStr())
		}
		return ref, "", nil
	case name.Tag:
		repo := strings.TrimSuffix(ref, ":"+r.TagStr())
		return repo + "@" + req.Digest, repo + ":" + r.TagStr(), nil
	}
	return "", "", errdefs.Invalid("reference", "%q is neither tagged nor pinned", ref)
}

// loopbackRegistry reports the reference's registry host and whether it
// is on loopback (by address, or the name localhost: nothing is resolved).
func loopbackRegistry(ref string) (string, bool) {
	r, err := name.ParseReference(ref, name.WithDefaultRegistry("no-registry.invalid"))
	if err != nil {
		return ref, false
	}
	reg := r.Context().RegistryStr()
	host := reg
	if h, _, err := net.SplitHostPort(reg); err == nil {
		host = h
	}
	if host == "localhost" {
		return reg, true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return reg, ip != nil && ip.IsLoopback()
}

// Remove removes an image (or, when the name is one of several the
// image has, only that name). An image a sandbox or snapshot was made
// from is refused with ErrConflict, naming them.
func (s Images) Remove(ctx context.Context, ref string) error {
	m := s.m
	if ref == image.HostImage {
		return errdefs.Invalid("name", "%q is the built-in image and cannot be removed", ref)
	}
	o, err := m.ociStore()
	if err != nil {
		return err
	}
	m.settleBriefly(ctx) // a sandbox just removed may still use it
	m.img.mu.Lock()
	defer m.img.mu.Unlock()
	img, err := o.Get(ref)
	if err != nil {
		return err
	}
	byID := strings.HasPrefix(ref, "sha256:") || (len(ref) >= 12 && strings.Trim(ref, "0123456789abcdef") == "")
	if len(img.Names) > 1 && !byID {
		// One name of several: the image stays, but a pool made by that
		// name could not refill.
		if pools := m.imagePools([]string{ref}); len(pools) > 0 {
			return errdefs.Conflict("image %s is in use by %s: set its size to 0 first", ref, strings.Join(pools, ", "))
		}
		return o.Remove(ref, nil)
	}
	if users := append(m.imageUsers(o, img.ID), m.imagePools(img.Names)...); len(users) > 0 {
		return errdefs.Conflict("image %s is in use by %s", ref, strings.Join(users, ", "))
	}
	if err := o.Remove(img.ID, nil); err != nil {
		return err
	}
	m.log.Info("image removed", "image", ref, "id", img.ID)
	return nil
}

// imageUsers lists the sandboxes and snapshots made from image id.
func (m *Manager) imageUsers(o *oci.Store, id string) []string {
	var users []string
	m.mu.Lock()
	for sid, b := range m.boxes {
		if b.rec.ImageID == id {
			users = append(users, "sandbox "+sid)
		}
	}
	m.mu.Unlock()
	if m.cfg.Templates != nil {
		for _, t := range m.cfg.Templates.List() {
			if t.Image == "" || t.Image == image.HostImage {
				continue
			}
			if img, err := o.Get(t.Image); err == nil && img.ID == id {
				users = append(users, "template "+t.Name)
			}
		}
	}
	if m.cfg.Snapshots != nil {
		for _, s := range m.cfg.Snapshots.List("") {
			if s.Image == "" || s.Image == image.HostImage {
				continue
			}
			if img, err := o.Get(s.Image); err == nil && img.ID == id {
				users = append(users, "snapshot "+s.ID)
			}
		}
	}
	sort.Strings(users)
	return users
}

func hostView(img *image.Image) api.Image {
	return api.Image{
		Name:    image.HostImage,
		Names:   []string{image.HostImage},
		ID:      img.ID,
		BuiltIn: true,
		Layers:  len(img.Layers) + len(img.Binds),
		Config:  api.ImageConfig{Env: img.Env, Workdir: img.Workdir},
	}
}

func ociView(img *oci.Image) api.Image {
	v := api.Image{
		Name:        img.Name,
		Names:       img.Names,
		ID:          img.ID,
		Digest:      img.Digest,
		RepoDigests: img.RepoDigests,
		Layers:      len(img.Layers),
		SizeBytes:   img.Size,
		Platform:    img.Platform,
		Config: api.ImageConfig{
			Env: img.Env, Workdir: img.Workdir, User: img.User,
			Entrypoint: img.Entrypoint, Cmd: img.Cmd, Labels: img.Labels,
		},
	}
	if !img.Created.IsZero() {
		t := img.Created
		v.CreatedAt = &t
	}
	if !img.Stored.IsZero() {
		t := img.Stored
		v.StoredAt = &t
	}
	return v
}

// pullTransport carries a pull's requests: it tells report the bytes of
// response bodies received so far (registry blobs, mostly), and, when
// plain HTTP was allowed only because the registry is on loopback, keeps
// it there: a redirect (to blob storage, a token service) may not lead a
// plain-HTTP request off the host.
type pullTransport struct {
	next             http.RoundTripper
	report           func(int64)
	httpLoopbackOnly bool
	n                atomic.Int64
}

func (t *pullTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.httpLoopbackOnly && req.URL.Scheme == "http" {
		if _, ok := loopbackRegistry(req.URL.Host + "/x"); !ok {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, errdefs.Invalid("insecure", "refusing plain HTTP to %s: only loopback registries get plain HTTP", req.URL.Host)
		}
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &countingBody{ReadCloser: resp.Body, t: t}
	return resp, nil
}

type countingBody struct {
	io.ReadCloser
	t *pullTransport
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.t.report(b.t.n.Add(int64(n)))
	}
	return n, err
}
