package oci

// Tag points name at the image nameOrDigest names (see Get), moving the
// name if it pointed elsewhere, and returns the image as seen by its new
// name. A pull by digest uses it to give the verified image its tag.
func (s *Store) Tag(nameOrDigest, name string) (*Image, error) {
	n, err := normalizeName(name)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	hexID, _, err := s.resolve(nameOrDigest)
	if err != nil {
		return nil, err
	}
	rec := s.images[hexID]
	if prev, ok := s.names[n]; ok && prev != rec.ID {
		s.log.Info("image name moved", "name", n, "from", short(prev), "to", short(rec.ID))
	}
	s.names[n] = rec.ID
	if err := s.saveNames(); err != nil {
		return nil, err
	}
	return s.image(rec, n), nil
}
