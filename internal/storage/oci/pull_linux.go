package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// PullOptions configure Pull.
type PullOptions struct {
	// Auth authenticates to the registry. When nil, Username and Password
	// are used if either is set, else the pull is anonymous. The host's
	// docker config and credential helpers are never consulted: the daemon
	// must not hand its operator's credentials to whatever registry a
	// caller names.
	Auth     authn.Authenticator
	Username string
	Password string
	// Insecure allows plain HTTP to the registry and its token service.
	// Without it every request must be HTTPS, loopback and private
	// addresses included (go-containerregistry would otherwise fall back
	// to HTTP for those unasked). TLS certificates are always verified.
	Insecure bool
	// Platform picks the image from a multi-platform index, as
	// "os/arch[/variant]"; empty means linux on this host's architecture.
	Platform string
	// Transport carries the requests; nil means go-containerregistry's
	// default (HTTP(S)_PROXY from the environment).
	Transport http.RoundTripper
}

// Pull fetches ref ("host[:port]/repo[:tag]" or "host[:port]/repo@sha256:...")
// from its registry and stores it under its canonical name. The registry
// must be named: nothing is pulled from an implied default. A digest pin
// is verified against the bytes received (an index pin, then the
// platform's image from it by its digest in the index). Layers already in
// the store are not fetched again. Errors: ErrInvalid for a bad reference
// or a corrupt or unsupported image, ErrDenied when the registry refuses
// the credentials, ErrNotFound when it has no such image or platform,
// ErrUnavailable when it cannot be reached, ErrTooLarge past a limit.
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (*Image, error) {
	r, err := parseName(ref)
	if err != nil {
		return nil, err
	}
	if r.Context().RegistryStr() == noRegistry {
		return nil, errdefs.Invalid("reference", "%q names no registry: write host[:port]/repository[:tag]", clip(ref))
	}
	if opts.Insecure {
		if r, err = name.ParseReference(ref, name.Insecure); err != nil {
			return nil, errdefs.Invalid("reference", "%q: %v", clip(ref), err)
		}
	}
	plat := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if opts.Platform != "" {
		p, err := v1.ParsePlatform(opts.Platform)
		if err != nil || p.OS == "" || p.Architecture == "" {
			return nil, errdefs.Invalid("platform", "%q is not os/arch[/variant]", opts.Platform)
		}
		plat = *p
	}
	auth := opts.Auth
	if auth == nil {
		auth = authn.Anonymous
		if opts.Username != "" || opts.Password != "" {
			auth = &authn.Basic{Username: opts.Username, Password: opts.Password}
		}
	}
	next := opts.Transport
	if next == nil {
		next = remote.DefaultTransport
	}
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuth(auth),
		remote.WithPlatform(plat),
		remote.WithTransport(&schemeGuard{next: next, allowHTTP: opts.Insecure}),
		remote.WithUserAgent("paddock"),
	}
	desc, err := remote.Get(r, ropts...)
	if err != nil {
		return nil, pullError(ref, err)
	}
	if int64(len(desc.Manifest)) > s.lim.MaxMetadataSize {
		return nil, fmt.Errorf("%w: %s: manifest of %d bytes exceeds %d", errdefs.ErrTooLarge, ref, len(desc.Manifest), s.lim.MaxMetadataSize)
	}
	if d, ok := r.(name.Digest); ok {
		want, err := v1.NewHash(d.DigestStr())
		if err != nil {
			return nil, errdefs.Invalid("reference", "%q: %v", clip(ref), err)
		}
		if err := checkSHA256(ref+": manifest", desc.Manifest, want); err != nil {
			return nil, err
		}
	}
	if !desc.MediaType.IsIndex() && !desc.MediaType.IsImage() {
		return nil, fmt.Errorf("%w: %s is a %s, not a container image", errdefs.ErrInvalid, ref, desc.MediaType)
	}
	img, err := desc.Image()
	if err != nil {
		var te *transport.Error
		var ne net.Error
		if desc.MediaType.IsIndex() && !errors.As(err, &te) && !errors.As(err, &ne) {
			return nil, fmt.Errorf("pulling %s: %w: no image for platform %s: %w", ref, errdefs.ErrNotFound, plat.String(), err)
		}
		return nil, pullError(ref, err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return nil, pullError(ref, err)
	}
	if int64(len(raw)) > s.lim.MaxMetadataSize {
		return nil, fmt.Errorf("%w: %s: manifest of %d bytes exceeds %d", errdefs.ErrTooLarge, ref, len(raw), s.lim.MaxMetadataSize)
	}
	sum := sha256.Sum256(raw)
	digest := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: parsing manifest: %w", errdefs.ErrInvalid, ref, err)
	}
	src := &source{
		what:        ref,
		names:       []string{canonicalName(r)},
		repoDigest:  repoName(r) + "@" + digest.String(),
		digest:      digest,
		mediaType:   m.MediaType,
		rawManifest: raw,
	}
	if src.mediaType == "" {
		src.mediaType = desc.MediaType
	}
	err = s.checkManifest(src, m, func(l v1.Descriptor) func() (io.ReadCloser, error) {
		return func() (io.ReadCloser, error) {
			layer, err := img.LayerByDigest(l.Digest)
			if err != nil {
				return nil, pullError(ref, err)
			}
			rc, err := layer.Compressed()
			if err != nil {
				return nil, pullError(ref, err)
			}
			return rc, nil
		}
	})
	if err != nil {
		return nil, err
	}
	if src.rawConfig, err = img.RawConfigFile(); err != nil {
		return nil, pullError(ref, err)
	}
	return s.commit(ctx, src)
}

// pullError puts a registry error in its category.
func pullError(ref string, err error) error {
	var plain *plainHTTPError
	if errors.As(err, &plain) {
		return fmt.Errorf("pulling %s: %w: %w", ref, errdefs.ErrInvalid, plain)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden ||
			hasCode(te, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return fmt.Errorf("pulling %s: %w: authentication failed (the registry refused the credentials): %w", ref, errdefs.ErrDenied, err)
		case te.StatusCode == http.StatusNotFound ||
			hasCode(te, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return fmt.Errorf("pulling %s: %w: %w", ref, errdefs.ErrNotFound, err)
		}
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return fmt.Errorf("pulling %s: %w: %w", ref, errdefs.ErrUnavailable, err)
	}
	return fmt.Errorf("pulling %s: %w", ref, err)
}

func hasCode(te *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range te.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

// schemeGuard refuses plain HTTP unless the pull was marked insecure, so
// that neither credentials nor unverified manifests cross the network in
// clear text by default. It sees every request, redirects and token
// fetches included.
type schemeGuard struct {
	next      http.RoundTripper
	allowHTTP bool
}

type plainHTTPError struct{ host string }

func (e *plainHTTPError) Error() string {
	return fmt.Sprintf("refusing plain HTTP to %s (allow it with the insecure option)", e.host)
}

func (g *schemeGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" && !g.allowHTTP {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, &plainHTTPError{host: req.URL.Host}
	}
	return g.next.RoundTrip(req)
}
