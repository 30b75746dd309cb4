package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"

	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// source is an image on its way into the store, from a registry or an
// archive: its verified metadata and a way to read each layer.
type source struct {
	what       string   // the reference or archive, for messages
	names      []string // canonical names to point at the image
	repoDigest string   // "repo@sha256:..." for a pull
	// digest is the manifest's digest and rawManifest its bytes; both are
	// empty for a `docker save` archive, which has no manifest.
	digest      v1.Hash
	mediaType   types.MediaType
	rawManifest []byte
	// rawConfig is the config blob; configDigest is what the manifest
	// says it hashes to (zero when there is no manifest).
	rawConfig    []byte
	configDigest v1.Hash
	layers       []blob // base first
}

// checkManifest validates a parsed manifest against the limits and fills
// the parts of src it describes; open returns a layer blob's reader.
func (s *Store) checkManifest(src *source, m *v1.Manifest, open func(v1.Descriptor) func() (io.ReadCloser, error)) error {
	if mt := m.Config.MediaType; mt != "" && !mt.IsConfig() {
		return fmt.Errorf("%w: %s is not a container image (its config is %s)", errdefs.ErrInvalid, src.what, mt)
	}
	if m.Config.Size > s.lim.MaxMetadataSize {
		return fmt.Errorf("%w: config of %d bytes exceeds %d", errdefs.ErrTooLarge, m.Config.Size, s.lim.MaxMetadataSize)
	}
	if len(m.Layers) > s.lim.MaxLayers {
		return fmt.Errorf("%w: %d layers exceed the limit of %d", errdefs.ErrTooLarge, len(m.Layers), s.lim.MaxLayers)
	}
	src.configDigest = m.Config.Digest
	for _, l := range m.Layers {
		if !l.MediaType.IsLayer() || !l.MediaType.IsDistributable() {
			return fmt.Errorf("%w: layer %s has media type %s, which is not a distributable image layer", errdefs.ErrInvalid, short(l.Digest.String()), l.MediaType)
		}
		if l.Digest.Algorithm != "sha256" || !hex64.MatchString(l.Digest.Hex) {
			return fmt.Errorf("%w: layer digest %s is not sha256", errdefs.ErrInvalid, l.Digest)
		}
		src.layers = append(src.layers, blob{digest: l.Digest, size: l.Size, open: open(l)})
	}
	return nil
}

// commit stores an image: it verifies the config, unpacks the layers no
// image has yet (in parallel: each is its own directory), and records the
// image and its names. If anything fails, the layers this call unpacked
// and nothing else uses are removed again.
func (s *Store) commit(ctx context.Context, src *source) (_ *Image, err error) {
	sum := sha256.Sum256(src.rawConfig)
	id := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	if (src.configDigest != v1.Hash{}) && src.configDigest != id {
		return nil, fmt.Errorf("%w: %s: config is corrupt: digest %s, manifest says %s", errdefs.ErrInvalid, src.what, id, src.configDigest)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(src.rawConfig))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: parsing config: %w", errdefs.ErrInvalid, src.what, err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, fmt.Errorf("%w: %s is a %s image; sandboxes run linux", errdefs.ErrInvalid, src.what, cfg.OS)
	}
	diffIDs := cfg.RootFS.DiffIDs
	if len(diffIDs) != len(src.layers) {
		return nil, fmt.Errorf("%w: %s: the manifest has %d layers but the config %d diff IDs", errdefs.ErrInvalid, src.what, len(src.layers), len(diffIDs))
	}
	if len(diffIDs) == 0 {
		return nil, fmt.Errorf("%w: %s has no layers", errdefs.ErrInvalid, src.what)
	}
	if len(diffIDs) > s.lim.MaxLayers {
		return nil, fmt.Errorf("%w: %d layers exceed the limit of %d", errdefs.ErrTooLarge, len(diffIDs), s.lim.MaxLayers)
	}
	for i, d := range diffIDs {
		if d.Algorithm != "sha256" || !hex64.MatchString(d.Hex) {
			return nil, fmt.Errorf("%w: %s: diff ID %q is not sha256", errdefs.ErrInvalid, src.what, d)
		}
		src.layers[i].diffID = d
	}

	// Pin every layer before looking for it, so that a concurrent Remove
	// cannot delete one this image is about to use.
	var unique []int // indexes of first occurrences
	seen := map[string]bool{}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: image store is closed", errdefs.ErrUnavailable)
	}
	for i, b := range src.layers {
		if !seen[b.diffID.Hex] {
			seen[b.diffID.Hex] = true
			unique = append(unique, i)
			s.pins[b.diffID.Hex]++
		}
	}
	s.mu.Unlock()
	made := make([]bool, len(src.layers))
	defer func() {
		s.mu.Lock()
		var drop []string
		for _, i := range unique {
			h := src.layers[i].diffID.Hex
			if s.pins[h]--; s.pins[h] == 0 {
				delete(s.pins, h)
			}
			if made[i] && err != nil && !s.usedByRecord(h, "") {
				drop = append(drop, h)
			}
		}
		trash := s.detachLayers(drop)
		s.mu.Unlock()
		s.emptyTrash(trash)
	}()

	start := time.Now()
	var imageLeft atomic.Int64
	imageLeft.Store(s.lim.MaxImageSize)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.parallel)
	for n, i := range unique {
		b := src.layers[i]
		g.Go(func() error {
			_, created, err := s.ensureLayer(gctx, b, &imageLeft)
			made[i] = created
			if err != nil {
				return fmt.Errorf("%s: layer %d of %d (%s): %w", src.what, n+1, len(unique), short(b.diffID.String()), err)
			}
			return nil
		})
	}
	if err = g.Wait(); err != nil {
		return nil, err
	}

	rec := &record{
		ID:        id.String(),
		Digest:    id.String(),
		MediaType: string(src.mediaType),
		Platform:  platformString(cfg),
		Created:   cfg.Created.UTC(),
		Stored:    time.Now().UTC(),
		Config: recordConfig{
			Env: cfg.Config.Env, Entrypoint: cfg.Config.Entrypoint, Cmd: cfg.Config.Cmd,
			WorkingDir: cfg.Config.WorkingDir, User: cfg.Config.User, Labels: cfg.Config.Labels,
		},
	}
	if (src.digest != v1.Hash{}) {
		rec.Digest = src.digest.String()
	}
	if src.repoDigest != "" {
		rec.RepoDigests = []string{src.repoDigest}
	}
	for _, b := range src.layers {
		l := recordLayer{DiffID: b.diffID.String()}
		if (b.digest != v1.Hash{}) {
			l.Digest = b.digest.String()
		}
		rec.Layers = append(rec.Layers, l)
	}
	if err = s.writeBlob(id, src.rawConfig); err != nil {
		return nil, err
	}
	if src.rawManifest != nil {
		if err = s.writeBlob(src.digest, src.rawManifest); err != nil {
			return nil, err
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.images[id.Hex]; old != nil {
		// The same image again (another name, another manifest for the
		// same content): keep the first record, add what is new.
		rec.Stored = old.Stored
		rec.RepoDigests = mergeStrings(old.RepoDigests, rec.RepoDigests)
		if (src.digest == v1.Hash{}) {
			rec.Digest = old.Digest
			rec.MediaType = old.MediaType
		}
	}
	if err = s.saveRecord(rec); err != nil {
		return nil, fmt.Errorf("recording image: %w", err)
	}
	s.images[id.Hex] = rec
	for _, n := range src.names {
		if prev, ok := s.names[n]; ok && prev != rec.ID {
			s.log.Info("image name moved", "name", n, "from", short(prev), "to", short(rec.ID))
		}
		s.names[n] = rec.ID
	}
	if err = s.saveNames(); err != nil {
		return nil, fmt.Errorf("recording image names: %w", err)
	}
	asked := ""
	if len(src.names) > 0 {
		asked = src.names[0]
	}
	img := s.image(rec, asked)
	s.log.Info("image stored", "image", src.what, "id", short(rec.ID), "layers", len(rec.Layers),
		"size", img.Size, "took", time.Since(start).Round(time.Millisecond))
	return img, nil
}

// writeBlob stores a verified config or manifest under blobs/.
func (s *Store) writeBlob(d v1.Hash, data []byte) error {
	p := filepath.Join(s.dir, "blobs", "sha256", d.Hex)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	return durable.WriteFile(p, data, 0o600)
}

func platformString(cfg *v1.ConfigFile) string {
	if cfg.OS == "" && cfg.Architecture == "" {
		return ""
	}
	p := cfg.OS + "/" + cfg.Architecture
	if cfg.Variant != "" {
		p += "/" + cfg.Variant
	}
	return p
}

func mergeStrings(a, b []string) []string {
	out := append([]string(nil), a...)
	for _, x := range b {
		found := false
		for _, y := range out {
			if x == y {
				found = true
				break
			}
		}
		if !found {
			out = append(out, x)
		}
	}
	return out
}

// checkSHA256 verifies that data hashes to d.
func checkSHA256(what string, data []byte, d v1.Hash) error {
	if d.Algorithm != "sha256" {
		return fmt.Errorf("%w: %s: digest %s is not sha256", errdefs.ErrInvalid, what, d)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != d.Hex {
		return fmt.Errorf("%w: %s is corrupt: digest sha256:%s, want %s", errdefs.ErrInvalid, what, got, d)
	}
	return nil
}
