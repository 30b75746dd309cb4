package server

// processRoutes are the /v1/sandboxes/{id}/processes endpoints.
func (s *Server) processRoutes() []route { return nil }
