package cas

import "path/filepath"

// objectPath is where the local backend keeps chunk id's object (tests damage
// objects on disk).
func (s *Store) objectPath(id ID) string {
	h := id.String()
	return filepath.Join(s.dir, objectsName, h[0:2], h[2:4], h[4:])
}
