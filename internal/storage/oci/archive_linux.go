package oci

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Annotations that name an image in an OCI layout's index.json.
const (
	annotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerdRef = "io.containerd.image.name"
)

// maxArchiveEntries bounds the entries of an archive given to Import (not
// of its layers: those have Limits.MaxEntries).
const maxArchiveEntries = 100000

// Import stores the image in r: a `docker save` archive (manifest.json)
// or an OCI image layout as a tar (oci-layout and index.json; Docker 25+
// writes both, and then the layout is used, for its manifest digests),
// optionally gzip-compressed. The archive is spooled to disk first (its
// parts are read out of order), within Limits.MaxArchiveSize.
//
// The image is stored under name when it is given, else under the names
// the archive gives it (RepoTags, or the index's image-name annotations);
// with neither it is reachable only by ID. An archive with several images
// needs a name that picks one. Every blob is checked against its digest
// where the archive has one, and every layer against its config's diff ID.
func (s *Store) Import(ctx context.Context, r io.Reader, name string) (*Image, error) {
	want := ""
	if name != "" {
		var err error
		if want, err = normalizeName(name); err != nil {
			return nil, err
		}
	}
	f, err := s.spool(ctx, r)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ar, err := indexArchive(f)
	if err != nil {
		return nil, err
	}
	var src *source
	switch {
	case ar.has("index.json") && ar.has("oci-layout"):
		src, err = s.ociArchive(ar, want)
	case ar.has("manifest.json"):
		src, err = s.dockerArchive(ar, want)
	default:
		return nil, fmt.Errorf("%w: not an image archive: it has neither manifest.json (docker save) nor oci-layout and index.json (OCI layout)", errdefs.ErrInvalid)
	}
	if err != nil {
		return nil, err
	}
	if want != "" {
		src.names = []string{want}
	}
	return s.commit(ctx, src)
}

// spool copies the archive into an unlinked temporary file, inflating it
// if it is gzip-compressed.
func (s *Store) spool(ctx context.Context, r io.Reader) (*os.File, error) {
	f, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), "import-")
	if err != nil {
		return nil, fmt.Errorf("spooling archive: %w", err)
	}
	// Unlinked at once: a crash leaves nothing to clean.
	os.Remove(f.Name())
	br := bufio.NewReaderSize(r, 64<<10)
	var in io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%w: archive: %w", errdefs.ErrInvalid, err)
		}
		defer zr.Close()
		in = zr
	}
	lim := &io.LimitedReader{R: ctxReader{ctx, in}, N: s.lim.MaxArchiveSize + 1}
	// A gzip-compressed archive inflates here: a small one can spool far
	// more than it sent, so the store's free space is checked as it goes.
	n, err := io.Copy(roomWriter{f, s}, lim)
	if err == nil && n > s.lim.MaxArchiveSize {
		err = fmt.Errorf("%w: archive is larger than %d bytes", errdefs.ErrTooLarge, s.lim.MaxArchiveSize)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("spooling archive: %w", err)
	}
	return f, nil
}

// roomWriter writes to a file of the store while the store's file system
// keeps MinFree free.
type roomWriter struct {
	f *os.File
	s *Store
}

func (w roomWriter) Write(p []byte) (int, error) {
	if err := w.s.room(int64(len(p))); err != nil {
		return 0, err
	}
	return w.f.Write(p)
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// archive is a spooled archive with the place of each regular file.
type archive struct {
	f       *os.File
	entries map[string]archiveEntry
}

type archiveEntry struct {
	off, size int64
	link      string // a symlink's or hard link's target, resolved to an entry name
}

// indexArchive reads the archive's headers once, seeking over contents.
func indexArchive(f *os.File) (*archive, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	ar := &archive{f: f, entries: map[string]archiveEntry{}}
	tr := tar.NewReader(f)
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading archive: %w", errdefs.ErrInvalid, err)
		}
		if n >= maxArchiveEntries {
			return nil, fmt.Errorf("%w: archive has more than %d entries", errdefs.ErrTooLarge, maxArchiveEntries)
		}
		key := path.Clean(strings.TrimLeft(hdr.Name, "/"))
		switch hdr.Typeflag {
		case tar.TypeReg:
			// tar.Reader reads headers straight from f, so f's offset is
			// where this entry's contents begin.
			off, err := f.Seek(0, io.SeekCurrent)
			if err != nil {
				return nil, err
			}
			ar.entries[key] = archiveEntry{off: off, size: hdr.Size}
		case tar.TypeSymlink:
			ar.entries[key] = archiveEntry{link: path.Join(path.Dir(key), hdr.Linkname)}
		case tar.TypeLink:
			ar.entries[key] = archiveEntry{link: path.Clean(strings.TrimLeft(hdr.Linkname, "/"))}
		}
	}
	return ar, nil
}

func (ar *archive) has(name string) bool {
	_, err := ar.lookup(name)
	return err == nil
}

// lookup finds a regular file, following links within the archive.
func (ar *archive) lookup(name string) (archiveEntry, error) {
	key := path.Clean(strings.TrimLeft(name, "/"))
	for range 8 {
		e, ok := ar.entries[key]
		if !ok {
			return archiveEntry{}, fmt.Errorf("%w: archive has no %q", errdefs.ErrInvalid, clip(name))
		}
		if e.link == "" {
			return e, nil
		}
		key = e.link
	}
	return archiveEntry{}, fmt.Errorf("%w: archive: too many links resolving %q", errdefs.ErrInvalid, clip(name))
}

func (ar *archive) open(name string) (*io.SectionReader, error) {
	e, err := ar.lookup(name)
	if err != nil {
		return nil, err
	}
	return io.NewSectionReader(ar.f, e.off, e.size), nil
}

// read returns a small file of the archive.
func (ar *archive) read(name string, limit int64) ([]byte, error) {
	sr, err := ar.open(name)
	if err != nil {
		return nil, err
	}
	if sr.Size() > limit {
		return nil, fmt.Errorf("%w: archive: %s is larger than %d bytes", errdefs.ErrTooLarge, clip(name), limit)
	}
	return io.ReadAll(sr)
}

func blobPath(d v1.Hash) string { return "blobs/" + d.Algorithm + "/" + d.Hex }

// readBlob returns a verified metadata blob of an OCI layout.
func (s *Store) readBlob(ar *archive, d v1.Descriptor) ([]byte, error) {
	if d.Digest.Algorithm != "sha256" || !hex64.MatchString(d.Digest.Hex) {
		return nil, fmt.Errorf("%w: archive: digest %s is not sha256", errdefs.ErrInvalid, d.Digest)
	}
	if d.Size > s.lim.MaxMetadataSize {
		return nil, fmt.Errorf("%w: archive: %s of %d bytes exceeds %d", errdefs.ErrTooLarge, d.MediaType, d.Size, s.lim.MaxMetadataSize)
	}
	data, err := ar.read(blobPath(d.Digest), s.lim.MaxMetadataSize)
	if err != nil {
		return nil, err
	}
	if err := checkSHA256("archive: blob "+short(d.Digest.String()), data, d.Digest); err != nil {
		return nil, err
	}
	return data, nil
}

// candidate is an image an archive offers.
type candidate struct {
	desc  v1.Descriptor // an OCI layout's manifest
	index int           // a docker archive's manifest.json entry
	names []string
}

// ociArchive reads an OCI image layout: index.json lists images (or
// multi-platform indexes, from which this host's platform is taken).
func (s *Store) ociArchive(ar *archive, want string) (*source, error) {
	layoutFile, err := ar.read("oci-layout", 4096)
	if err != nil {
		return nil, err
	}
	var lf struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(layoutFile, &lf); err != nil || !strings.HasPrefix(lf.Version, "1.") {
		return nil, fmt.Errorf("%w: archive: unsupported oci-layout %q", errdefs.ErrInvalid, clip(string(layoutFile)))
	}
	raw, err := ar.read("index.json", s.lim.MaxMetadataSize)
	if err != nil {
		return nil, err
	}
	index, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: archive: index.json: %w", errdefs.ErrInvalid, err)
	}
	plat := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	var cands []candidate
	for _, d := range index.Manifests {
		c := candidate{desc: d, names: annotatedNames(d.Annotations)}
		switch {
		case d.MediaType.IsImage():
			cands = append(cands, c)
		case d.MediaType.IsIndex():
			raw, err := s.readBlob(ar, d)
			if err != nil {
				return nil, err
			}
			child, err := v1.ParseIndexManifest(bytes.NewReader(raw))
			if err != nil {
				return nil, fmt.Errorf("%w: archive: index %s: %w", errdefs.ErrInvalid, short(d.Digest.String()), err)
			}
			for _, cd := range child.Manifests {
				if cd.MediaType.IsImage() && cd.Platform != nil && cd.Platform.Satisfies(plat) {
					c.desc = cd
					cands = append(cands, c)
					break
				}
			}
		}
	}
	c, err := pick(cands, want)
	if err != nil {
		return nil, err
	}
	rawManifest, err := s.readBlob(ar, c.desc)
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(rawManifest))
	if err != nil {
		return nil, fmt.Errorf("%w: archive: manifest: %w", errdefs.ErrInvalid, err)
	}
	src := &source{
		what:        "archive",
		names:       c.names,
		digest:      c.desc.Digest,
		mediaType:   m.MediaType,
		rawManifest: rawManifest,
	}
	if len(c.names) > 0 {
		src.what = "archive " + c.names[0]
	}
	err = s.checkManifest(src, m, func(l v1.Descriptor) func() (io.ReadCloser, error) {
		return func() (io.ReadCloser, error) {
			sr, err := ar.open(blobPath(l.Digest))
			if err != nil {
				return nil, err
			}
			return io.NopCloser(sr), nil
		}
	})
	if err != nil {
		return nil, err
	}
	if src.rawConfig, err = s.readBlob(ar, m.Config); err != nil {
		return nil, err
	}
	return src, nil
}

// annotatedNames returns the image names in an index entry's
// annotations. org.opencontainers.image.ref.name is often a bare tag
// ("v1"), which names no repository: it counts only when it has one.
func annotatedNames(a map[string]string) []string {
	var out []string
	for _, k := range []string{annotationContainerdRef, annotationRefName} {
		v := a[k]
		if v == "" || (k == annotationRefName && !strings.ContainsAny(v, "/:@")) {
			continue
		}
		if n, err := normalizeName(v); err == nil && !contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// pick chooses the image an Import means: the one the wanted name
// names, or the only one.
func pick(cands []candidate, want string) (candidate, error) {
	if want != "" {
		for _, c := range cands {
			if contains(c.names, want) {
				return c, nil
			}
		}
	}
	switch len(cands) {
	case 0:
		return candidate{}, fmt.Errorf("%w: archive has no image for linux/%s", errdefs.ErrNotFound, runtime.GOARCH)
	case 1:
		return cands[0], nil
	}
	var names []string
	for _, c := range cands {
		names = append(names, c.names...)
	}
	sort.Strings(names)
	if want != "" {
		return candidate{}, fmt.Errorf("%w: archive has %d images and none is named %s (it has: %s)", errdefs.ErrNotFound, len(cands), want, strings.Join(names, ", "))
	}
	return candidate{}, fmt.Errorf("%w: archive has %d images; name the one to import (it has: %s)", errdefs.ErrInvalid, len(cands), strings.Join(names, ", "))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// dockerArchive reads a `docker save` archive: manifest.json lists each
// image's config and layer files, base first. It has no manifest digests;
// a layer stored as blobs/sha256/<hex> is still checked against that
// digest, and every layer against its diff ID.
func (s *Store) dockerArchive(ar *archive, want string) (*source, error) {
	raw, err := ar.read("manifest.json", s.lim.MaxMetadataSize)
	if err != nil {
		return nil, err
	}
	var m tarball.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%w: archive: manifest.json: %w", errdefs.ErrInvalid, err)
	}
	var cands []candidate
	for i, d := range m {
		c := candidate{index: i}
		for _, t := range d.RepoTags {
			if n, err := normalizeName(t); err == nil && !contains(c.names, n) {
				c.names = append(c.names, n)
			}
		}
		cands = append(cands, c)
	}
	c, err := pick(cands, want)
	if err != nil {
		return nil, err
	}
	d := m[c.index]
	if len(d.LayerSources) > 0 {
		return nil, fmt.Errorf("%w: archive: foreign layers are not supported", errdefs.ErrInvalid)
	}
	if len(d.Layers) > s.lim.MaxLayers {
		return nil, fmt.Errorf("%w: %d layers exceed the limit of %d", errdefs.ErrTooLarge, len(d.Layers), s.lim.MaxLayers)
	}
	src := &source{what: "archive", names: c.names, mediaType: types.DockerManifestSchema2}
	if len(c.names) > 0 {
		src.what = "archive " + c.names[0]
	}
	if src.rawConfig, err = ar.read(d.Config, s.lim.MaxMetadataSize); err != nil {
		return nil, err
	}
	for _, p := range d.Layers {
		e, err := ar.lookup(p)
		if err != nil {
			return nil, err
		}
		b := blob{size: e.size}
		if dir, h := path.Split(path.Clean(p)); dir == "blobs/sha256/" && hex64.MatchString(h) {
			b.digest = v1.Hash{Algorithm: "sha256", Hex: h}
		}
		b.open = func() (io.ReadCloser, error) {
			return io.NopCloser(io.NewSectionReader(ar.f, e.off, e.size)), nil
		}
		src.layers = append(src.layers, b)
	}
	return src, nil
}
