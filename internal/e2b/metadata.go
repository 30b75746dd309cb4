package e2b

import (
	"net/http"
	"strings"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// File metadata, as envd 0.6.2 keeps it: an upload's X-Metadata-KEY
// headers become user.e2b.KEY extended attributes (keys lowercased), an
// upload replaces the whole set, and entry infos carry every user.e2b.*
// attribute of the file, set through the SDK or from inside the sandbox
// (setfattr -n user.e2b.owner -v me FILE).

// metadataHeader prefixes an upload's metadata headers.
const metadataHeader = "X-Metadata-"

// metadataXattr prefixes the attributes that hold file metadata.
const metadataXattr = "user.e2b."

// Bounds on one upload's metadata, inside what the guest accepts.
const (
	maxMetadataKeys  = 32
	maxMetadataValue = 1024
)

// metadataHeaders returns an upload's metadata as attribute names →
// values; nil when there is none. Keys are HTTP tokens, values printable
// ASCII, as the SDKs check before sending.
func metadataHeaders(h http.Header) (map[string]string, error) {
	var out map[string]string
	for name, values := range h {
		key, ok := cutPrefixFold(name, metadataHeader)
		if !ok || len(values) == 0 {
			continue
		}
		key = strings.ToLower(key)
		if key == "" || len(key) > 128 || strings.ContainsFunc(key, notTokenChar) {
			return nil, errdefs.Invalid("metadata", "key %.40q is not an HTTP token", key)
		}
		v := values[0]
		if len(v) > maxMetadataValue || strings.ContainsFunc(v, func(c rune) bool { return c < 0x20 || c > 0x7e }) {
			return nil, errdefs.Invalid("metadata", "the value of %q is not printable ASCII of at most %d bytes", key, maxMetadataValue)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[metadataXattr+key] = v
	}
	if len(out) > maxMetadataKeys {
		return nil, errdefs.Invalid("metadata", "%d keys, at most %d", len(out), maxMetadataKeys)
	}
	return out, nil
}

// fileMetadata turns a file's user.e2b.* attributes into envd's metadata
// map; nil when there are none.
func fileMetadata(xattrs map[string]string) map[string]string {
	var out map[string]string
	for name, v := range xattrs {
		key, ok := strings.CutPrefix(name, metadataXattr)
		if !ok || key == "" {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = v
	}
	return out
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return "", false
	}
	return s[len(prefix):], true
}

// notTokenChar reports a character outside RFC 9110's tchar.
func notTokenChar(c rune) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return false
	}
	return !strings.ContainsRune("!#$%&'*+-.^_`|~", c)
}
