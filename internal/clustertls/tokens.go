package clustertls

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
)

// MinToken is the shortest token a token file may hold.
const MinToken = 16

// Tokens is a token file: the bearer tokens a listener accepts, one a
// line, the first of them the one a caller presents. It is re-read, at
// most once a second, when a call finds it changed (a mounted Kubernetes
// Secret, which kubelet swaps whole), so that tokens rotate with no
// restart and no failed call:
//
//  1. add the new token as a second line: every node accepts both, the
//     gateways still present the old one;
//  2. once every pod has the file, swap the lines: the gateways present
//     the new one, which every node accepts;
//  3. once every pod has that, remove the old line: nodes refuse it.
//
// A file that does not load (unreadable, empty, a token shorter than
// MinToken) keeps the last good set, with a log line.
type Tokens struct {
	src *source[tokenSet]
}

// tokenSet is one version of the file, immutable.
type tokenSet struct {
	all    []string
	bearer []string // "Bearer " + each, for the Authorization header
	check  [][]byte // bearer's bytes, for Accepts
}

// LoadTokens reads the token file at path.
func LoadTokens(path string, log *slog.Logger) (*Tokens, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Tokens{src: &source[tokenSet]{what: "token file", dir: filepath.Dir(path), files: []string{filepath.Base(path)}, log: log,
		parse: func(f [][]byte) (*tokenSet, error) { return parseTokens(string(f[0])) }}}
	if err := t.src.load(); err != nil {
		return nil, err
	}
	return t, nil
}

// StaticTokens is a set that never changes (tests, a token given inline).
func StaticTokens(tokens ...string) (*Tokens, error) {
	set, err := parseTokens(strings.Join(tokens, "\n"))
	if err != nil {
		return nil, err
	}
	t := &Tokens{src: &source[tokenSet]{}}
	t.src.cur.Store(set)
	t.src.checked.Store(1 << 62) // never due
	return t, nil
}

func parseTokens(s string) (*tokenSet, error) {
	set := &tokenSet{}
	for line := range strings.Lines(s) {
		tok := strings.TrimSpace(line)
		if tok == "" {
			continue
		}
		if len(tok) < MinToken {
			return nil, fmt.Errorf("a token (line %d) is shorter than %d characters", len(set.all)+1, MinToken)
		}
		if strings.ContainsAny(tok, " \t") {
			return nil, fmt.Errorf("a token (line %d) holds a space", len(set.all)+1)
		}
		set.all = append(set.all, tok)
		set.bearer = append(set.bearer, "Bearer "+tok)
		set.check = append(set.check, []byte("Bearer "+tok))
	}
	if len(set.all) == 0 {
		return nil, errors.New("the token file holds no token")
	}
	return set, nil
}

// Present is the token a caller presents: the file's first.
func (t *Tokens) Present() string { return t.src.get().all[0] }

// Authorization is the Authorization header that presents it.
func (t *Tokens) Authorization() string { return t.src.get().bearer[0] }

// All lists the tokens accepted now, the presented one first. The slice
// is shared: do not change it.
func (t *Tokens) All() []string { return t.src.get().all }

// Accepts reports whether header, an Authorization header's value, is
// "Bearer " and one of the tokens. Each is compared in constant time.
func (t *Tokens) Accepts(header string) bool {
	got, ok := []byte(header), 0
	for _, b := range t.src.get().check {
		ok |= subtle.ConstantTimeCompare(got, b)
	}
	return ok == 1
}
