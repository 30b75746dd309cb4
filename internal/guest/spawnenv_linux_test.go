package guest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestMergeEnvRule: mergeEnv keeps each key's first place and last value,
// below and above the size at which it switches to a map; checked against
// a plain map-based merge on random environments with repeated keys and
// entries without '='.
func TestMergeEnvRule(t *testing.T) {
	want := func(base, over []string) []string {
		var out []string
		idx := map[string]int{}
		for _, kv := range append(slices.Clone(base), over...) {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := idx[k]; ok {
				out[i] = kv
				continue
			}
			idx[k] = len(out)
			out = append(out, kv)
		}
		return out
	}
	r := rand.New(rand.NewPCG(1, 2))
	gen := func(n, keys int) []string {
		env := make([]string, n)
		for i := range env {
			k := fmt.Sprintf("K%d", r.IntN(keys))
			switch r.IntN(5) {
			case 0:
				env[i] = k // no '='
			case 1:
				env[i] = k + "=" // empty value
			default:
				env[i] = fmt.Sprintf("%s=%d", k, r.IntN(1000))
			}
		}
		return env
	}
	for trial := range 400 {
		size := []int{0, 1, 5, 20, mergeEnvMap - 1, mergeEnvMap, 150}[trial%7]
		base, over := gen(size, size+3), gen(r.IntN(10), size+3)
		if got, w := mergeEnv(base, over), want(base, over); !slices.Equal(got, w) {
			t.Fatalf("mergeEnv(%q, %q)\n = %q\nwant %q", base, over, got, w)
		}
	}
	// A key is not another key's prefix.
	if got := mergeEnv([]string{"PATHX=1", "PATH=/bin"}, []string{"PATH=/usr/bin"}); !slices.Equal(got, []string{"PATHX=1", "PATH=/usr/bin"}) {
		t.Errorf("prefix keys: %q", got)
	}
}
