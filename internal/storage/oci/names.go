package oci

import (
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// noRegistry stands in for "no registry given" while parsing a name: the
// library would otherwise fill in its own default registry. .invalid is
// reserved (RFC 2606) and never resolves.
const noRegistry = "no-registry.invalid"

// reservedRepo is the built-in image's name (internal/storage/image): an
// OCI image may not shadow it.
const reservedRepo = "host"

// parseName parses an image name or reference, with ":latest" implied.
func parseName(s string) (name.Reference, error) {
	if s == "" || len(s) > 512 || strings.ContainsAny(s, " \t\r\n") {
		return nil, errdefs.Invalid("name", "%q is not an image reference", clip(s))
	}
	ref, err := name.ParseReference(s, name.WithDefaultRegistry(noRegistry))
	if err != nil {
		return nil, errdefs.Invalid("name", "%q: %v", clip(s), err)
	}
	return ref, nil
}

// canonicalName writes a reference the way names are stored: the
// registry only if one was given, and always a tag or a digest
// ("app" -> "app:latest", "127.0.0.1:5000/app" -> "127.0.0.1:5000/app:latest").
func canonicalName(ref name.Reference) string {
	repo := ref.Context().RepositoryStr()
	if reg := ref.Context().RegistryStr(); reg != noRegistry {
		repo = reg + "/" + repo
	}
	switch r := ref.(type) {
	case name.Digest:
		return repo + "@" + r.DigestStr()
	case name.Tag:
		return repo + ":" + r.TagStr()
	}
	return repo + ":latest"
}

// repoName is a reference's repository as stored ("host:port/repo").
func repoName(ref name.Reference) string {
	repo := ref.Context().RepositoryStr()
	if reg := ref.Context().RegistryStr(); reg != noRegistry {
		repo = reg + "/" + repo
	}
	return repo
}

// normalizeName checks a name an image is to be stored under and returns
// its canonical form.
func normalizeName(s string) (string, error) {
	ref, err := parseName(s)
	if err != nil {
		return "", err
	}
	if ref.Context().RegistryStr() == noRegistry && ref.Context().RepositoryStr() == reservedRepo {
		return "", errdefs.Invalid("name", "%q is the built-in image's name", s)
	}
	return canonicalName(ref), nil
}
