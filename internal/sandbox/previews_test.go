package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestPreviews: a preview's token opens its sandbox's port and nothing
// else; the record keeps only its hash; previews outlive a restart and
// end when revoked.
func TestPreviews(t *testing.T) {
	tb := newTestbed(t)
	ctx := context.Background()
	id := tb.create().ID
	for _, bad := range []api.PreviewRequest{{Port: 0}, {Port: 70000}, {Port: 80, ExpiresSeconds: -1}, {Port: 80, ExpiresSeconds: 31 * 24 * 3600}} {
		if _, err := tb.m.CreatePreview(ctx, id, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v, want invalid", bad, err)
		}
	}
	p, err := tb.m.CreatePreview(ctx, id, api.PreviewRequest{Port: 3000})
	if err != nil || p.Token == "" || !strings.HasPrefix(p.ID, id+".") || p.Path != "/preview/"+p.ID+"/" {
		t.Fatalf("create: %+v %v", p, err)
	}
	pub, _ := tb.m.CreatePreview(ctx, id, api.PreviewRequest{Port: 3001, Public: true})
	if pub.Token != "" {
		t.Fatalf("a public preview has a token: %+v", pub)
	}
	open := func(pid, token string) error {
		t.Helper()
		sb, port, err := tb.m.OpenPreview(pid, token)
		if err == nil && (sb != id || (port != 3000 && port != 3001)) {
			t.Fatalf("OpenPreview(%s) = %s %d", pid, sb, port)
		}
		return err
	}
	if err := open(p.ID, p.Token); err != nil {
		t.Fatal(err)
	}
	for _, tc := range [][2]string{{p.ID, ""}, {p.ID, p.Token + "x"}, {pub.ID + "x", ""}, {"nosuch." + p.ID, p.Token}, {"../x", ""}} {
		if err := open(tc[0], tc[1]); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("OpenPreview(%q, %q): %v, want denied", tc[0], tc[1], err)
		}
	}
	if err := open(pub.ID, ""); err != nil {
		t.Fatalf("a public preview: %v", err)
	}
	tb.stop()
	tb.start()
	if err := open(p.ID, p.Token); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if list, _ := tb.m.Previews(ctx, id); len(list) != 2 || list[0].Token != "" {
		t.Fatalf("list: %+v", list)
	}
	if n, err := tb.m.RevokePreviews(ctx, id, "", 3000); n != 1 || err != nil {
		t.Fatalf("revoke by port: %d %v", n, err)
	}
	if err := open(p.ID, p.Token); !errors.Is(err, errdefs.ErrDenied) {
		t.Fatalf("a revoked preview opens: %v", err)
	}
	if _, err := tb.m.RevokePreviews(ctx, id, p.ID, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("revoking it again: %v", err)
	}
}
