package image

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/storage/oci"
)

// ociDefaultPath is the PATH a sandbox of an OCI image gets when the
// image's config sets none (Docker does the same).
const ociDefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// OpenOCI opens the store of OCI images under the image directory
// ("oci/"): names that are not built in are looked up there.
func (s *Store) OpenOCI(log *slog.Logger, opts ...oci.Option) (*oci.Store, error) {
	o, err := oci.Open(filepath.Join(s.dir, "oci"), log, opts...)
	if err != nil {
		return nil, fmt.Errorf("opening OCI image store: %w", err)
	}
	s.mu.Lock()
	s.oci = o
	s.mu.Unlock()
	return o, nil
}

// OCI returns the store of OCI images, or nil when none was opened.
func (s *Store) OCI() *oci.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.oci
}

// getOCI resolves a name that is not a built-in image.
func (s *Store) getOCI(name string) (*Image, error) {
	o := s.OCI()
	if o == nil {
		return nil, errdefs.NotFound("image", name)
	}
	img, err := o.Get(name)
	if err != nil {
		return nil, err
	}
	return FromOCI(img), nil
}

// FromOCI is what a sandbox's root filesystem is built from for an OCI
// image: its layers, and the defaults of its config. The image's user is
// not applied: commands run as root unless a request names a user, as in
// every other sandbox.
func FromOCI(img *oci.Image) *Image {
	out := &Image{
		Name:    img.Name,
		ID:      img.ID,
		Layers:  append([]string(nil), img.Layers...),
		Env:     append([]string(nil), img.Env...),
		Workdir: img.Workdir,
	}
	if out.Name == "" {
		out.Name = img.ID
	}
	if out.Workdir == "" {
		out.Workdir = "/"
	}
	hasPath := false
	for _, e := range out.Env {
		if strings.HasPrefix(e, "PATH=") {
			hasPath = true
		}
	}
	if !hasPath {
		out.Env = append([]string{ociDefaultPath}, out.Env...)
	}
	return out
}
