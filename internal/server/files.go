package server

// fileRoutes are the /v1/sandboxes/{id}/files endpoints.
func (s *Server) fileRoutes() []route { return nil }
