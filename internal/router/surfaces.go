package router

import (
	"net/http"
	"strings"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/server"
)

// A gateway serves the agent surfaces that ride on its API as a daemon
// does (the console at /ui/ and /mcp wrap Handler: daemon.Surfaces), but
// not preview URLs: a preview is served by the node that holds its
// sandbox, on that node's --preview-listen, at the URL that node prints.
// A preview's path at the gateway answers so, ahead of the token check
// (a browser following a link has none), as a node serves its previews.
func (rt *Router) noPreviews(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/preview/") {
			next.ServeHTTP(w, r)
			return
		}
		server.WriteError(w, r, rt.log, errdefs.New(errdefs.ErrNotFound,
			"preview URLs are not served through a cluster gateway: each is served by the node that holds its sandbox, on that node's --preview-listen, at the URL `paddock port ID PORT --url` prints"))
	})
}
