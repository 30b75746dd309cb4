package server

// portRoutes are the /v1/sandboxes/{id}/ports endpoints.
func (s *Server) portRoutes() []route { return nil }
