package guest

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

func credential(name string) (*syscall.Credential, string, error) {
	if name == "" || name == "root" || name == "0" {
		return nil, "/root", nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		if u, err = user.LookupId(name); err != nil {
			return nil, "", errdefs.Invalid("user", "unknown user %q", name)
		}
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				cred.Groups = append(cred.Groups, uint32(n))
			}
		}
	}
	return cred, u.HomeDir, nil
}

// lookPath finds an executable the way execvp does, in the sandbox.
func lookPath(name, path, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := executable(p); err != nil {
			return "", err
		}
		return p, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, name)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", errdefs.New(errdefs.ErrNotFound, "%s: executable file not found in $PATH", name)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		if os.IsNotExist(err) {
			return errdefs.New(errdefs.ErrNotFound, "%s: no such file or directory", p)
		}
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s: permission denied", p)
	}
	return nil
}

// mergeEnv returns base with over's keys replaced or added: a key keeps
// its first place and takes its last value. It runs before every fork,
// and environments are short: up to mergeEnvMap entries a key is looked
// up by a scan, which costs less than making a map (a map and a copy of
// base were 15 µs of each exec's way on a small VM).
func mergeEnv(base, over []string) []string {
	out := make([]string, 0, len(base)+len(over))
	var idx map[string]int // key → place in out, for long environments
	if len(base)+len(over) > mergeEnvMap {
		idx = make(map[string]int, len(base)+len(over))
	}
	for _, list := range [2][]string{base, over} {
		for _, kv := range list {
			k, _, _ := strings.Cut(kv, "=")
			i, ok := -1, false
			if idx != nil {
				i, ok = idx[k]
			} else {
				i = indexKey(out, k)
				ok = i >= 0
			}
			if ok {
				out[i] = kv
				continue
			}
			if idx != nil {
				idx[k] = len(out)
			}
			out = append(out, kv)
		}
	}
	return out
}

// mergeEnvMap is the size above which mergeEnv indexes keys with a map.
const mergeEnvMap = 64

// indexKey returns the index of key's entry in env, or -1.
func indexKey(env []string, key string) int {
	for i, kv := range env {
		if strings.HasPrefix(kv, key) && (len(kv) == len(key) || kv[len(key)] == '=') {
			return i
		}
	}
	return -1
}

func hasKey(env []string, key string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}

func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, _ := strings.Cut(kv, "="); k == key {
			v = val
		}
	}
	return v
}
