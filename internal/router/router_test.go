package router

import (
	"errors"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

func rec(name, tag string, mut ...func(*api.Node)) api.Node {
	n := api.Node{Name: name, Tag: tag, Address: "http://127.0.0.1:1", State: api.NodeReady}
	for _, m := range mut {
		m(&n)
	}
	return n
}

// TestTable: tags route ids; records that could make an id ambiguous, or
// cannot be reached, are left out while the rest serve.
func TestTable(t *testing.T) {
	rt := New(Config{})
	rt.SetNodes([]api.Node{
		rec("n1", "a"),
		rec("n2", "b1"),
		rec("n3", "ab"), // "a" starts it: left out
		rec("n4", "B"),  // not a tag
		rec("n5", "c", func(n *api.Node) { n.Address = "ftp://x" }), // not http(s)
		rec("n6", "d", func(n *api.Node) { n.State = api.NodeLost }),
		rec("n1", "e"), // a name twice
	})
	for _, tc := range []struct {
		id   string
		node string
		err  error
		msg  string
	}{
		{id: "a12345678901", node: "n1"},
		{id: "b1x", node: "n2"},
		{id: "b2x", err: errdefs.ErrNotFound, msg: "the tags: a, b1, d"},
		{id: "ab0000000000", node: "n1"},
		{id: "d00000000000", err: errdefs.ErrUnavailable, msg: "node n6 (tag d)"},
		{id: "../etc", err: errdefs.ErrInvalid},
		{id: "", err: errdefs.ErrInvalid},
	} {
		n, err := rt.owner(tc.id, tc.id)
		switch {
		case tc.err != nil && (!errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg)):
			t.Errorf("owner(%q) = %v; want %v with %q", tc.id, err, tc.err, tc.msg)
		case tc.err == nil && (err != nil || n.Name != tc.node):
			t.Errorf("owner(%q) = %v, %v; want node %s", tc.id, n, err, tc.node)
		}
	}
}

// TestPick: ready nodes with the labels and room, warm ones first, then
// spread (or pack); a burst spreads by what the gateway placed; with no
// room the error names the resource.
func TestPick(t *testing.T) {
	gib := int64(1 << 30)
	capacity := func(mem int64, sandboxes int) func(*api.Node) {
		return func(n *api.Node) {
			n.Capacity = api.NodeResources{MemoryBytes: mem * gib, Sandboxes: sandboxes}
		}
	}
	d := demand{res: api.NodeResources{MemoryBytes: gib, Sandboxes: 1}, pools: []string{"image:host"}}
	picks := func(rt *Router, d demand, k int) string {
		var out []string
		for range k {
			n, _, err := rt.pick(d, map[string]bool{})
			if err != nil {
				out = append(out, "-")
				continue
			}
			out = append(out, n.Name)
		}
		return strings.Join(out, " ")
	}

	rt := New(Config{})
	rt.SetNodes([]api.Node{rec("n1", "a", capacity(4, 0)), rec("n2", "b", capacity(2, 0)), rec("n3", "c", capacity(8, 0), func(n *api.Node) { n.State = api.NodeDraining })})
	if got, want := picks(rt, d, 7), "n1 n2 n1 n1 n2 n1 -"; got != want {
		t.Errorf("spread: picks %q; want %q", got, want)
	}
	_, _, err := rt.pick(d, map[string]bool{})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "memory") {
		t.Errorf("all full: %v; want unavailable naming memory", err)
	}

	rt = New(Config{Pack: true})
	rt.SetNodes([]api.Node{rec("n1", "a", capacity(4, 0)), rec("n2", "b", capacity(2, 0))})
	if got, want := picks(rt, d, 7), "n1 n1 n1 n1 n2 n2 -"; got != want {
		t.Errorf("pack: picks %q; want %q", got, want)
	}

	warm := func(k int) func(*api.Node) { return func(n *api.Node) { n.Pools = map[string]int{"image:host": k} } }
	rt = New(Config{})
	rt.SetNodes([]api.Node{rec("n1", "a", capacity(4, 0)), rec("n2", "b", capacity(4, 0), warm(2))})
	if got, want := picks(rt, d, 4), "n2 n2 n1 n1"; got != want {
		t.Errorf("warm first: picks %q; want %q", got, want)
	}

	labelled := func(n *api.Node) { n.Labels = map[string]string{"gpu": "yes"} }
	rt = New(Config{})
	rt.SetNodes([]api.Node{rec("n1", "a"), rec("n2", "b", labelled)})
	sel := d
	sel.selector = map[string]string{"gpu": "yes"}
	if got, want := picks(rt, sel, 2), "n2 n2"; got != want {
		t.Errorf("selector: picks %q; want %q", got, want)
	}
	sel.selector = map[string]string{"gpu": "no"}
	if _, _, err := rt.pick(sel, map[string]bool{}); err == nil || !strings.Contains(err.Error(), "gpu=no") {
		t.Errorf("selector nobody has: %v", err)
	}
	// A refusal is taken back: the next pick sees the node as before.
	n, taken, _ := rt.pick(d, map[string]bool{})
	rt.unplace(n, d, taken)
	if got := rt.placed[n.Name].res.Sandboxes; got != 0 {
		t.Errorf("after unplace: %d placed", got)
	}
}

// tokens is a token set of tok alone.
func tokens(tb testing.TB, tok string) *clustertls.Tokens {
	tb.Helper()
	t, err := clustertls.StaticTokens(tok)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}
