package server

import (
	"context"
	"net/http"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
)

// containerKey carries the container a request addresses (the query's
// api.ContainerParam) to the calls that reach a guest.
type containerKey struct{}

// withContainer reads the container a request addresses: its handlers
// reach that container's guest (guest, done). A malformed name is refused
// here, before any handler runs.
func (s *Server) withContainer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get(api.ContainerParam)
		if name == "" {
			next.ServeHTTP(w, r)
			return
		}
		if !api.IsContainerName(name) {
			writeError(w, r, s.log, errdefs.Invalid(api.ContainerParam, "%q is not a container name", name))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), containerKey{}, name)))
	})
}

// containerOf is the container ctx's request addresses; "" is the first.
func containerOf(ctx context.Context) string {
	name, _ := ctx.Value(containerKey{}).(string)
	return name
}

// guest is the guest of the container the request addresses in sandbox id.
func (s *Server) guest(ctx context.Context, id string) (*guestapi.Client, error) {
	return s.mgr.ContainerGuest(ctx, id, containerOf(ctx))
}

// done is closed when that container's guest ends.
func (s *Server) done(ctx context.Context, id string) (<-chan struct{}, error) {
	return s.mgr.ContainerDone(ctx, id, containerOf(ctx))
}
